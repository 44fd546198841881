//! What agent calls cost and what a thread may spend: [`Usage`] (tokens as services report
//! them, priced by `prices:`), recorded with each step and journaled call, and [`Budget`]
//! (`--max-tokens`, `--max-cost`, …), checked before each agent call.

use serde::{Deserialize, Serialize};

/// What agent calls cost: tokens as the service reported them (an OpenAI-compatible
/// endpoint's `usage`, or a command agent's `usage` field), and their price where
/// `prices:` in config.yaml names the model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    /// Input tokens served from the provider's prompt cache (a part of `input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_tokens: u64,
    /// The calls these figures add up.
    #[serde(default)]
    pub calls: u64,
    /// The model that answered (the last one, when calls of several models are added up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// In US dollars; absent when no call had a price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// These tokens (and cost) on a span: a step's, or an agent call's.
    pub fn trace(&self, span: &tracing::Span) {
        crate::telemetry::record_tokens(
            span,
            self.input_tokens,
            self.output_tokens,
            self.cached_tokens,
            self.cost_usd,
        );
    }

    /// `self` and `other` added up.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_tokens += other.cached_tokens;
        self.calls += other.calls;
        if other.model.is_some() {
            self.model.clone_from(&other.model);
        }
        self.cost_usd = match (self.cost_usd, other.cost_usd) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
    }

    /// All of `usages` added up; `None` if there are none.
    pub fn sum<'a>(usages: impl IntoIterator<Item = &'a Usage>) -> Option<Usage> {
        let mut total: Option<Usage> = None;
        for usage in usages {
            total.get_or_insert_with(Usage::default).add(usage);
        }
        total
    }

    /// Every token, in and out.
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

/// What a thread may spend on its agents. When its next agent call would go over, it pauses
/// (reason `budget`) instead; `resume --raise-budget` continues it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    /// Tokens in and out, over every call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// US dollars, as `prices:` in config.yaml price the calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Agent calls made (a call answered again from the journal is not made again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_agent_calls: Option<u64>,
    /// Time since the thread started, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_ms: Option<u64>,
}

impl Budget {
    pub fn is_empty(&self) -> bool {
        *self == Budget::default()
    }

    /// This budget with what `raise` sets in place of its own.
    pub fn raised(&self, raise: &Budget) -> Budget {
        Budget {
            max_tokens: raise.max_tokens.or(self.max_tokens),
            max_cost_usd: raise.max_cost_usd.or(self.max_cost_usd),
            max_agent_calls: raise.max_agent_calls.or(self.max_agent_calls),
            max_duration_ms: raise.max_duration_ms.or(self.max_duration_ms),
        }
    }

    /// Why `calls` more agent calls would go over, after `spent` and `elapsed_ms` since the
    /// thread started; `None` if they may be made.
    pub fn exceeded(&self, spent: &Usage, elapsed_ms: u64, calls: u64) -> Option<String> {
        if let Some(max) = self.max_tokens
            && spent.tokens() >= max
        {
            return Some(format!("{} tokens spent, of a budget of {max}", spent.tokens()));
        }
        if let Some(max) = self.max_cost_usd
            && spent.cost_usd.unwrap_or(0.0) >= max
        {
            let cost = spent.cost_usd.unwrap_or(0.0);
            return Some(format!("${cost:.4} spent, of a budget of ${max}"));
        }
        if let Some(max) = self.max_agent_calls
            && spent.calls + calls > max
        {
            return Some(format!(
                "{} agent calls made and {calls} more asked, of a budget of {max}",
                spent.calls
            ));
        }
        if let Some(max) = self.max_duration_ms
            && elapsed_ms >= max
        {
            return Some(format!(
                "{} since the thread started, of a budget of {}",
                humantime::format_duration(std::time::Duration::from_millis(
                    elapsed_ms / 1000 * 1000
                )),
                humantime::format_duration(std::time::Duration::from_millis(max))
            ));
        }
        None
    }
}
