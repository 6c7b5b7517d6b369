//! `offload.host_expert_layers` (llama.cpp's `--n-cpu-moe`, and its `-ot` by layer): which
//! mixture-of-experts layers keep every routed expert on the host whatever the budget. One
//! value type, its text form (`12`: the first 12 MoE layers; `0,2,5-7`: those decoder
//! layers) and how it resolves against a model's layers, where an index out of range or a
//! layer without experts is an error that names it.

use super::values::{Codec, Shown};

/// Which MoE layers keep every expert on the host by setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostExpertLayers {
    /// The first this many MoE layers (0: none, the budget decides).
    First(usize),
    /// These decoder layers, by index (sorted, no repeats).
    List(Vec<usize>),
}

impl Default for HostExpertLayers {
    fn default() -> Self {
        HostExpertLayers::First(0)
    }
}

impl HostExpertLayers {
    /// Whether no layer is pinned to the host by this setting.
    pub fn is_none(&self) -> bool {
        match self {
            HostExpertLayers::First(n) => *n == 0,
            HostExpertLayers::List(layers) => layers.is_empty(),
        }
    }

    /// The decoder layers this setting pins, for a model of `n_layers` layers of which
    /// `moe_layers` (in order) have routed experts. A first-N count larger than the MoE layers
    /// takes them all; a listed index beyond the model or on a dense layer is an error naming it.
    pub fn resolve(&self, moe_layers: &[usize], n_layers: usize) -> Result<Vec<usize>, String> {
        match self {
            HostExpertLayers::First(n) => Ok(moe_layers.iter().copied().take(*n).collect()),
            HostExpertLayers::List(layers) => {
                if let Some(&bad) = layers.iter().find(|&&l| l >= n_layers) {
                    return Err(format!(
                        "`offload.host_expert_layers` names layer {bad}, but the model has {n_layers} layers (0-{})",
                        n_layers.saturating_sub(1)
                    ));
                }
                if let Some(&dense) = layers.iter().find(|l| !moe_layers.contains(l)) {
                    return Err(format!(
                        "`offload.host_expert_layers` names layer {dense}, which has no routed experts (the MoE layers: {})",
                        ranges(moe_layers)
                    ));
                }
                Ok(layers.clone())
            }
        }
    }
}

/// `0,2,5-7` for `[0, 2, 5, 6, 7]` (sorted input).
fn ranges(layers: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &l in layers {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == l => *last = l,
            _ => runs.push((l, l)),
        }
    }
    runs.iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The codec of `offload.host_expert_layers`: a number (the first N MoE layers) or a
/// comma-separated list of layer indices and ranges `a-b` (a single layer: `5,` or `5-5`).
pub struct ExpertLayers;
impl Codec for ExpertLayers {
    type Value = HostExpertLayers;
    fn parse(text: &str) -> Result<HostExpertLayers, String> {
        let text = text.trim();
        if let Ok(n) = text.parse::<usize>() {
            return Ok(HostExpertLayers::First(n));
        }
        let accepted = "takes N (the first N MoE layers) or a list of layer indices like `0,2,5-7`";
        let index = |part: &str| {
            part.trim().parse::<usize>().map_err(|_| {
                format!("`{part}` is not a layer index (host_expert_layers {accepted})")
            })
        };
        let mut layers = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (index(a)?, index(b)?);
                    if a > b {
                        return Err(format!("`{part}` is an empty range (write {b}-{a})"));
                    }
                    layers.extend(a..=b);
                }
                None => layers.push(index(part)?),
            }
        }
        if layers.is_empty() {
            return Err(format!("`{text}`: host_expert_layers {accepted}"));
        }
        layers.sort_unstable();
        layers.dedup();
        Ok(HostExpertLayers::List(layers))
    }
    fn show(value: &HostExpertLayers) -> Shown {
        match value {
            HostExpertLayers::First(n) => Shown::Number(*n as u64),
            HostExpertLayers::List(layers) => Shown::Text(ranges(layers)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_is_the_first_n_moe_layers_and_a_list_names_layers() {
        assert_eq!(ExpertLayers::parse("3"), Ok(HostExpertLayers::First(3)));
        assert_eq!(
            ExpertLayers::parse(" 5-7, 0,2,6 "),
            Ok(HostExpertLayers::List(vec![0, 2, 5, 6, 7]))
        );
        assert_eq!(
            ExpertLayers::parse("4,"),
            Ok(HostExpertLayers::List(vec![4]))
        );
        let shown = ExpertLayers::show(&HostExpertLayers::List(vec![0, 2, 5, 6, 7]));
        assert_eq!(shown, Shown::Text("0,2,5-7".into()));
        assert_eq!(
            ExpertLayers::show(&HostExpertLayers::First(2)),
            Shown::Number(2)
        );
    }

    #[test]
    fn a_bad_list_says_what_is_accepted() {
        for bad in ["a", "1,x", "3-1", ",", "1-"] {
            let error = ExpertLayers::parse(bad).expect_err(bad);
            assert!(
                error.contains("layer") || error.contains("range"),
                "{bad}: {error}"
            );
        }
        assert!(ExpertLayers::parse("3-1").unwrap_err().contains("1-3"));
    }

    #[test]
    fn resolving_names_layers_out_of_range_or_without_experts() {
        let moe = [1, 2, 3];
        assert_eq!(HostExpertLayers::First(2).resolve(&moe, 4), Ok(vec![1, 2]));
        assert_eq!(
            HostExpertLayers::First(9).resolve(&moe, 4),
            Ok(vec![1, 2, 3])
        );
        assert_eq!(
            HostExpertLayers::List(vec![1, 3]).resolve(&moe, 4),
            Ok(vec![1, 3])
        );
        let far = HostExpertLayers::List(vec![2, 7])
            .resolve(&moe, 4)
            .unwrap_err();
        assert!(
            far.contains("layer 7") && far.contains("4 layers (0-3)"),
            "{far}"
        );
        let dense = HostExpertLayers::List(vec![0])
            .resolve(&moe, 4)
            .unwrap_err();
        assert!(
            dense.contains("layer 0") && dense.contains("1-3"),
            "{dense}"
        );
    }
}
