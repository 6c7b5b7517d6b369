//! The per-expert tier decision ([`decide`]): a table of (setting, cost model, rows routed to
//! the expert) and the tier it must give.

use super::*;

/// A unit whose copy takes 1 ms on the link below and whose host compute takes 0.4 ms a row:
/// host compute wins at 1 and 2 rows, streaming from 3.
fn unit() -> UnitWork {
    UnitWork {
        weight_bytes: 1_000_000,
        flops_per_row: 2e6,
        activation_bytes_per_row: 0,
    }
}

fn model() -> CostModel {
    CostModel {
        link_bytes_per_s: 1e9,
        host_flops_per_s: 5e9,
        host_read_bytes_per_s: 1e12,
        device_flops_per_s: 1e15,
        forced: None,
        activation_bytes_per_s: None,
    }
}

#[test]
fn each_expert_is_decided_by_the_rows_routed_to_it() {
    let cost = model();
    assert_eq!(cost.crossover(&unit()), Some(3));
    // A batch of 8 rows: one expert picked by 1 row, one by 6; the step's 8 rows would have
    // streamed both.
    let table: &[(TierChoice, Option<&CostModel>, usize, Tier)] = &[
        (TierChoice::Auto, Some(&cost), 1, Tier::Host),
        (TierChoice::Auto, Some(&cost), 2, Tier::Host),
        (TierChoice::Auto, Some(&cost), 3, Tier::Stream),
        (TierChoice::Auto, Some(&cost), 6, Tier::Stream),
        (TierChoice::Auto, Some(&cost), 8, Tier::Stream),
        // Without a cost model: the fixed switch, per expert.
        (TierChoice::Auto, None, 1, Tier::Host),
        (TierChoice::Auto, None, AUTO_HOST_ROWS - 1, Tier::Host),
        (TierChoice::Auto, None, AUTO_HOST_ROWS, Tier::Stream),
        // A forced setting decides alone, whatever the cost model says.
        (TierChoice::Host, Some(&cost), 6, Tier::Host),
        (TierChoice::Host, None, 64, Tier::Host),
        (TierChoice::Stream, Some(&cost), 1, Tier::Stream),
        (TierChoice::Stream, None, 1, Tier::Stream),
    ];
    for &(setting, cost, rows, want) in table {
        assert_eq!(
            decide(setting, cost, &unit(), rows),
            want,
            "{setting:?}, cost model {}, {rows} rows",
            cost.is_some()
        );
    }
}

#[test]
fn a_forced_cost_model_decides_every_expert() {
    for forced in Tier::ALL {
        let cost = CostModel {
            forced: Some(forced),
            ..model()
        };
        for rows in [1, 6, 64] {
            assert_eq!(decide(TierChoice::Auto, Some(&cost), &unit(), rows), forced);
        }
    }
}
