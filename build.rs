//! Build script: gives a CUDA build of ferry a RUNPATH of `$ORIGIN/lib`, so a bundle that carries
//! the CUDA libraries in a `lib/` folder beside the binary starts without `LD_LIBRARY_PATH`
//! (README, "CUDA"). Link arguments only: nothing else about the build changes, and dependencies
//! are not rebuilt (a RUSTFLAGS change would rebuild all of them).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_CUDA");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some()
        && std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
    {
        // `--enable-new-dtags`: DT_RUNPATH (searched after LD_LIBRARY_PATH), not DT_RPATH.
        println!("cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib");
    }
}
