"""Unpacks a .tar.xz with Python's tarfile/lzma, for machines without the xz tool.

    unpack.py ARCHIVE DEST
"""

import sys
import tarfile


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    archive, dest = argv
    with tarfile.open(archive, "r:xz") as tar:
        members = tar.getmembers()
        for m in members:
            if m.name.startswith("/") or ".." in m.name.split("/"):
                raise ValueError(f"refusing unsafe path {m.name!r} in {archive}")
        tar.extractall(dest)
    print(f"unpacked {len(members)} entries from {archive} into {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
