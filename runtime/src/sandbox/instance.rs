//! A bundle instance, whichever version of the contract it targets: pre-instantiated,
//! instantiated, its descriptor read, its generator started and stepped, all in one shape, so
//! that nothing outside this module knows there is more than one version.

use wasmtime::Store;
use wasmtime::component::ResourceAny;

use super::bindings::{self, Contract, v0_1};
use super::state::ThreadState;
use crate::ids::ThreadId;
use crate::store::descriptor::RoleText;
use crate::store::records::StepRecord;

/// The thread's recorded steps as either contract version's `role-output` list.
macro_rules! role_outputs {
    ($steps:expr, $wit:path) => {{
        use $wit as Output;
        $steps
            .iter()
            .map(|s| Output {
                role: s.role.clone(),
                content: s.content.clone(),
                meta: s.meta.to_string(),
                timestamp: s.timestamp,
            })
            .collect()
    }};
}

/// A bundle checked against its world and pre-instantiated: ready to instantiate quickly.
#[derive(Clone)]
pub enum BundlePre {
    V0_1(v0_1::BundlePre<ThreadState>),
    V0_2(bindings::BundlePre<ThreadState>),
}

/// An instantiated bundle.
pub enum Instance {
    V0_1(v0_1::Bundle),
    V0_2(bindings::Bundle),
}

/// A bundle's generator: a thread being run inside its instance.
pub struct GuestThread {
    instance: Instance,
    thread: ResourceAny,
}

/// What a bundle says about itself, as it said it (checked by the caller).
pub struct RawDescriptor {
    pub description: String,
    pub max_rounds: u32,
    pub roles: Vec<RoleText>,
}

/// One role output a bundle yielded, not yet checked.
#[derive(Debug, Clone)]
pub struct Output {
    pub role: String,
    pub content: String,
    /// JSON text, as the bundle gave it.
    pub meta: String,
}

/// One step of a generator.
#[derive(Debug, Clone)]
pub enum GeneratorStep {
    /// Role outputs that finished together (one, or a parallel group).
    Outputs(Vec<Output>),
    /// The workflow is over.
    Done { return_code: i32, summary: String },
}

/// What a thread starts from (the continuation contract).
pub struct ThreadInput<'a> {
    pub thread_id: ThreadId,
    pub prompt: &'a str,
    /// The steps already recorded.
    pub steps: &'a [StepRecord],
    pub trigger_data: Option<&'a str>,
    pub max_rounds: u32,
}

impl BundlePre {
    /// The contract version the bundle targets.
    pub fn contract(&self) -> Contract {
        match self {
            BundlePre::V0_1(_) => Contract::V0_1,
            BundlePre::V0_2(_) => Contract::V0_2,
        }
    }

    /// Instantiates the bundle (running its start code) in `store`.
    pub async fn instantiate(&self, store: &mut Store<ThreadState>) -> wasmtime::Result<Instance> {
        Ok(match self {
            BundlePre::V0_1(pre) => Instance::V0_1(pre.instantiate_async(store).await?),
            BundlePre::V0_2(pre) => Instance::V0_2(pre.instantiate_async(store).await?),
        })
    }
}

impl Instance {
    /// Calls the bundle's `descriptor()`.
    pub async fn descriptor(
        &self,
        store: &mut Store<ThreadState>,
    ) -> wasmtime::Result<RawDescriptor> {
        // The two versions' descriptor types are distinct types of the same shape.
        macro_rules! convert {
            ($raw:expr) => {{
                let raw = $raw;
                RawDescriptor {
                    description: raw.description,
                    max_rounds: raw.default_max_rounds,
                    roles: raw
                        .roles
                        .into_iter()
                        .map(|r| RoleText {
                            name: r.name,
                            description: r.description,
                            system_prompt: r.system_prompt,
                            extract_prompt: r.extract_prompt,
                            schema: r.schema,
                        })
                        .collect(),
                }
            }};
        }
        Ok(match self {
            Instance::V0_1(b) => {
                convert!(b.uncaged_workflow_workflow().call_descriptor(store).await?)
            }
            Instance::V0_2(b) => {
                convert!(b.uncaged_workflow_workflow().call_descriptor(store).await?)
            }
        })
    }

    /// Constructs the bundle's generator for a thread that continues after `input.steps`.
    pub async fn start(
        self,
        store: &mut Store<ThreadState>,
        input: ThreadInput<'_>,
    ) -> wasmtime::Result<GuestThread> {
        let thread = match &self {
            Instance::V0_1(b) => {
                let run = v0_1::RunInput {
                    prompt: input.prompt.to_string(),
                    steps: role_outputs!(input.steps, v0_1::RoleOutput),
                };
                let options = v0_1::RunOptions {
                    thread_id: input.thread_id.to_string(),
                    max_rounds: input.max_rounds,
                };
                b.uncaged_workflow_workflow()
                    .thread()
                    .call_constructor(store, &run, &options)
                    .await?
            }
            Instance::V0_2(b) => {
                let run = bindings::RunInput {
                    prompt: input.prompt.to_string(),
                    steps: role_outputs!(input.steps, bindings::RoleOutput),
                    trigger_data: input.trigger_data.map(str::to_string),
                };
                let options = bindings::RunOptions {
                    thread_id: input.thread_id.to_string(),
                    max_rounds: input.max_rounds,
                };
                b.uncaged_workflow_workflow()
                    .thread()
                    .call_constructor(store, &run, &options)
                    .await?
            }
        };
        Ok(GuestThread { instance: self, thread })
    }
}

impl GuestThread {
    /// Asks the generator for its next step.
    pub async fn next(&self, store: &mut Store<ThreadState>) -> wasmtime::Result<GeneratorStep> {
        Ok(match &self.instance {
            Instance::V0_1(b) => {
                match b.uncaged_workflow_workflow().thread().call_next(store, self.thread).await? {
                    v0_1::Step::Output(o) => GeneratorStep::Outputs(vec![Output {
                        role: o.role,
                        content: o.content,
                        meta: o.meta,
                    }]),
                    v0_1::Step::Done(r) => {
                        GeneratorStep::Done { return_code: r.return_code, summary: r.summary }
                    }
                }
            }
            Instance::V0_2(b) => {
                match b.uncaged_workflow_workflow().thread().call_next(store, self.thread).await? {
                    bindings::Step::Outputs(outputs) => GeneratorStep::Outputs(
                        outputs
                            .into_iter()
                            .map(|o| Output { role: o.role, content: o.content, meta: o.meta })
                            .collect(),
                    ),
                    bindings::Step::Done(r) => {
                        GeneratorStep::Done { return_code: r.return_code, summary: r.summary }
                    }
                }
            }
        })
    }
}
