//! What a step builder is ([`StepBuilder`]), what it reads ([`Context`]) and what it returns ([`Draft`]).

use inplace_agent_api::{StepAction, StepKind};

use crate::Action;
use crate::plan::error::PlanError;
use crate::plan::inputs::PlanInput;
use crate::plan::view::KubeadmConfigSpec;

/// One row of [`BUILDERS`].
pub(crate) struct StepBuilder {
    /// The action whose steps it builds: it runs only when the settings allow it and the change moves it.
    /// `None` for a step no action does, which its builder adds when the plan inputs (a setting) ask for it.
    pub action: Option<Action>,
    /// Whether it reads the desired bootstrap config (decoded only when a builder that runs reads it).
    pub reads_bootstrap: bool,
    /// The kinds of the steps it may build.
    pub kinds: &'static [StepKind],
    /// Its steps, in order.
    pub build: fn(&Context<'_>) -> Result<Vec<Draft>, PlanError>,
}

/// What a builder reads: the plan's input and the bootstrap config's spec, decoded once.
pub(crate) struct Context<'a> {
    /// Everything the plan is built from.
    pub input: &'a PlanInput<'a>,
    /// The desired KubeadmConfig's spec, when a running builder reads it and it has one.
    pub spec: Option<&'a KubeadmConfigSpec>,
}

/// A step before it has its index: what the plan says, the action and its timeout.
pub(crate) struct Draft {
    /// The step's description.
    pub description: String,
    /// The step's timeout, in seconds.
    pub timeout_seconds: u32,
    /// What the agent converges the node to.
    pub action: StepAction,
}

impl Draft {
    /// A step with its kind's timeout from the step-kind table.
    pub fn new(description: impl Into<String>, action: StepAction) -> Draft {
        Draft {
            description: description.into(),
            timeout_seconds: action.step_kind().timeout_seconds(),
            action,
        }
    }
}
