//! `FERRY_*` variables that are not settings: a typo (`FERRY_GPU_MEM`) would otherwise be
//! ignored in silence, so each unknown one gets a warning naming the closest known variable.

use super::settings::{closest, SETTINGS};

/// `FERRY_*` variables that are not settings but are read by the project's scripts and tests
/// (scripts/fetch-model.sh, scripts/gpu-check.sh, benches/, tests/): never warned about.
pub const OTHER_VARIABLES: &[&str] = &[
    "FERRY_TEST_MODEL",
    "FERRY_GPU_TEST_MODEL",
    "FERRY_PYTHON",
    "FERRY_BENCH_VENV",
    "FERRY_CUDA_HOME",
    "FERRY_CUDA_TARGET_DIR",
    "FERRY_GPU_CHECK_DRY_RUN",
    "FERRY_GPU_CHECK_WORK",
];

/// One warning per `FERRY_*` name in `names` that is neither a setting's variable nor one of
/// [`OTHER_VARIABLES`], e.g. "unknown environment variable FERRY_GPU_MEM (did you mean
/// FERRY_GPU_MEMORY?)".
pub fn unknown_variables(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let known: Vec<String> = SETTINGS.iter().map(|s| s.env()).collect();
    let mut warnings = Vec::new();
    for name in names {
        if !name.starts_with("FERRY_")
            || known.contains(&name)
            || OTHER_VARIABLES.contains(&name.as_str())
        {
            continue;
        }
        let hint = closest(&name, known.iter().map(String::as_str))
            .map(|k| format!(" (did you mean {k}?)"))
            .unwrap_or_else(|| " (README.md lists the FERRY_* settings)".to_string());
        warnings.push(format!(
            "unknown environment variable {name} is ignored{hint}"
        ));
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_the_closest_known_name() {
        let warnings = unknown_variables(
            [
                "FERRY_GPU_MEM",
                "FERRY_PORT",
                "FERRY_TEST_MODEL",
                "PATH",
                "FERRY_ZZZ",
            ]
            .map(String::from),
        );
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].contains("FERRY_GPU_MEM ") && warnings[0].contains("FERRY_GPU_MEMORY"),
            "{warnings:?}"
        );
        assert!(warnings[1].contains("FERRY_ZZZ"), "{warnings:?}");
    }

    #[test]
    fn scripts_variables_are_not_settings() {
        for name in OTHER_VARIABLES {
            assert!(
                !SETTINGS.iter().any(|s| s.env() == *name),
                "{name} is both a setting and a script variable"
            );
        }
    }
}
