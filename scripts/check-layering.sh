#!/usr/bin/env bash
# The layer table, checked where Cargo cannot check it. Each layer is a crate, so Cargo already
# refuses an import of a crate that is not a declared dependency, and a dependency that closes a
# cycle (a lower layer naming one that names it) fails the build. What Cargo allows and the
# layering does not is a dependency sideways or upward that closes no cycle, say ferry-gpu on
# ferry-metrics, or ferry-engine on ferry-model. This script reads the workspace's manifests
# (`cargo metadata --no-deps`, no build) and checks every dependency between ferry's crates
# against the layers below, lowest first:
#
#   0  ferry-config, ferry-gpu, ferry-metrics, ferry-chat
#                                settings, CUDA primitives, the metrics registry, the chat message
#   1  ferry-model, ferry-engine   a model (files, tokenizer, families, kernels); generation and
#                                batching, which knows models only through its traits
#   2  ferry-offload, ferry-server placement and streaming of weights; HTTP, which knows only the
#                                engine's Backend trait
#   3  ferry                       runtime, CLI and `main`: builds it all
#
# A crate may depend on crates of a lower layer only. ferry-testkit (helpers for tests) may only
# be a dev-dependency; a dev-dependency otherwise follows the same rule. A workspace crate missing
# from the table is an error too, so a new crate has to be placed.
#
# Usage: scripts/check-layering.sh [WORKSPACE_DIR] (default: the repository root). Prints every
# offending dependency and exits 1 when there is one.
set -euo pipefail
root="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
[[ -f "$root/Cargo.toml" ]] || { echo "check-layering: no Cargo.toml in $root" >&2; exit 2; }

metadata="$(cargo metadata --format-version 1 --no-deps --offline --manifest-path "$root/Cargo.toml")"

if printf '%s' "$metadata" | perl -MJSON::PP -e '
use strict;
use warnings;
my %rank = ("ferry-config" => 0, "ferry-gpu" => 0, "ferry-metrics" => 0, "ferry-chat" => 0,
            "ferry-model" => 1, "ferry-engine" => 1,
            "ferry-offload" => 2, "ferry-server" => 2, "ferry" => 3);
my %dev_only = ("ferry-testkit" => 1);
my $meta = JSON::PP->new->decode(do { local $/; <STDIN> });
my %members = map { $_ => 1 } @{ $meta->{workspace_members} };
my $bad = 0;
for my $pkg (sort { $a->{name} cmp $b->{name} } @{ $meta->{packages} }) {
    next unless $members{ $pkg->{id} };
    my $name = $pkg->{name};
    if (!exists $rank{$name} && !$dev_only{$name}) {
        print STDERR "$name: not in the layer table (scripts/check-layering.sh)\n";
        $bad = 1;
        next;
    }
    for my $dep (@{ $pkg->{dependencies} }) {
        my $target = $dep->{name};
        next unless exists $rank{$target} || $dev_only{$target};
        my $kind = $dep->{kind} // "normal";
        if ($dev_only{$target}) {
            next if $kind eq "dev";
            print STDERR "$name depends on $target ($kind): $target is for tests only,",
                " a dev-dependency\n";
            $bad = 1;
            next;
        }
        next if $dev_only{$name};
        next if $rank{$target} < $rank{$name};
        print STDERR "$name (layer $rank{$name}) depends on $target (layer $rank{$target}):",
            " crates depend on lower layers only\n";
        $bad = 1;
    }
}
exit $bad;
'; then
  echo "check-layering: every dependency runs downward"
else
  exit 1
fi
