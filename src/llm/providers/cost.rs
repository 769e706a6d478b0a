//! What a step cost: its tokens at the prices of the providers file (SPEC §16, §21).

use super::Price;
use crate::model::Usage;

/// Costs are kept to the nano-dollar: sums of many steps then show no binary noise.
const PER_USD: f64 = 1e9;

/// A dollar amount rounded to the nano-dollar.
pub fn round_usd(usd: f64) -> f64 {
    (usd * PER_USD).round() / PER_USD
}

impl Price {
    /// What `usage` costs at this price, in US dollars rounded to the nano-dollar: input
    /// tokens at `input_per_mtok`, output tokens at `output_per_mtok`, per million. The
    /// tokens a provider read from its cache are counted among the input tokens (the usage
    /// of a step does not tell them apart), so they are priced as input.
    pub fn cost_usd(&self, usage: Usage) -> f64 {
        let input = usage.input_tokens as f64 * self.input_per_mtok;
        let output = usage.output_tokens as f64 * self.output_per_mtok;
        round_usd((input + output) / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_costs_its_tokens_at_the_price_per_million() {
        // By hand: 1,234 input tokens at $3.00 per million = 1234 × 3 / 1e6 = $0.003702;
        // 567 output tokens at $15.00 per million = 567 × 15 / 1e6 = 8505 / 1e6 = $0.008505;
        // together $0.012207.
        let price = Price {
            input_per_mtok: 3.0,
            output_per_mtok: 15.0,
            cache_read_per_mtok: Some(0.3),
        };
        let usage = Usage {
            input_tokens: 1234,
            output_tokens: 567,
        };
        assert_eq!(price.cost_usd(usage), 0.012207);
        // By hand: 7 input tokens at $0.15 = 1.05e-6; 3 output tokens at $0.60 = 1.8e-6;
        // together $0.00000285, which the nano-dollar keeps exactly.
        let price = Price {
            input_per_mtok: 0.15,
            output_per_mtok: 0.6,
            cache_read_per_mtok: None,
        };
        let usage = Usage {
            input_tokens: 7,
            output_tokens: 3,
        };
        assert_eq!(price.cost_usd(usage), 0.00000285);
        assert_eq!(price.cost_usd(Usage::default()), 0.0);
        // A tenth of a nano-dollar rounds away: 1 token at $0.0001 per million is 1e-10.
        let tiny = Price {
            input_per_mtok: 0.0001,
            output_per_mtok: 0.0,
            cache_read_per_mtok: None,
        };
        let one = Usage {
            input_tokens: 1,
            output_tokens: 0,
        };
        assert_eq!(tiny.cost_usd(one), 0.0);
    }

    #[test]
    fn sums_are_rounded_to_the_nano_dollar() {
        // 0.1 + 0.2 is 0.30000000000000004 in binary; rounded it is 0.3.
        assert_eq!(round_usd(0.1 + 0.2), 0.3);
    }
}
