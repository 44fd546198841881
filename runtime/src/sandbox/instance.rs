//! A bundle instance, whichever version of the contract it targets: pre-instantiated,
//! instantiated, its descriptor read, its generator started and stepped, all in one shape, so
//! that nothing outside this module knows there is more than one version.

use wasmtime::Store;
use wasmtime::component::ResourceAny;

use super::bindings::{self, Contract, v0_1, v0_2};
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

/// Starts the generator of a bundle of 0.2.0 or a later contract of the same `run-input`.
macro_rules! start_v0_2 {
    ($bundle:expr, $wit:ident, $store:expr, $input:expr) => {{
        let run = $wit::RunInput {
            prompt: $input.prompt.to_string(),
            steps: role_outputs!($input.steps, $wit::RoleOutput),
            trigger_data: $input.trigger_data.map(str::to_string),
        };
        let options = $wit::RunOptions {
            thread_id: $input.thread_id.to_string(),
            max_rounds: $input.max_rounds,
        };
        $bundle
            .uncaged_workflow_workflow()
            .thread()
            .call_constructor($store, &run, &options)
            .await?
    }};
}

/// Steps the generator of a bundle of 0.2.0 or a later contract of the same `step`.
macro_rules! next_v0_2 {
    ($bundle:expr, $wit:ident, $store:expr, $thread:expr) => {{
        match $bundle.uncaged_workflow_workflow().thread().call_next($store, $thread).await? {
            $wit::Step::Outputs(outputs) => GeneratorStep::Outputs(
                outputs
                    .into_iter()
                    .map(|o| Output { role: o.role, content: o.content, meta: o.meta })
                    .collect(),
            ),
            $wit::Step::Done(r) => {
                GeneratorStep::Done { return_code: r.return_code, summary: r.summary }
            }
        }
    }};
}

/// A bundle checked against its world and pre-instantiated: ready to instantiate quickly.
#[derive(Clone)]
pub enum BundlePre {
    V0_1(v0_1::BundlePre<ThreadState>),
    V0_2(v0_2::BundlePre<ThreadState>),
    V0_3(bindings::BundlePre<ThreadState>),
}

/// An instantiated bundle.
pub enum Instance {
    V0_1(v0_1::Bundle),
    V0_2(v0_2::Bundle),
    V0_3(bindings::Bundle),
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
    /// JSON Schema (as JSON text) of the data a thread starts with, if the bundle declares
    /// one (0.3.0 on).
    pub input_schema: Option<String>,
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
            BundlePre::V0_3(_) => Contract::V0_3,
        }
    }

    /// Instantiates the bundle (running its start code) in `store`.
    pub async fn instantiate(&self, store: &mut Store<ThreadState>) -> wasmtime::Result<Instance> {
        Ok(match self {
            BundlePre::V0_1(pre) => Instance::V0_1(pre.instantiate_async(store).await?),
            BundlePre::V0_2(pre) => Instance::V0_2(pre.instantiate_async(store).await?),
            BundlePre::V0_3(pre) => Instance::V0_3(pre.instantiate_async(store).await?),
        })
    }
}

impl Instance {
    /// Calls the bundle's `descriptor()`.
    pub async fn descriptor(
        &self,
        store: &mut Store<ThreadState>,
    ) -> wasmtime::Result<RawDescriptor> {
        // The versions' descriptor types are distinct types of the same shape, but for the
        // input schema 0.3.0 added.
        macro_rules! convert {
            ($raw:expr, $input_schema:expr) => {{
                let raw = $raw;
                RawDescriptor {
                    description: raw.description,
                    max_rounds: raw.default_max_rounds,
                    input_schema: $input_schema,
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
                convert!(b.uncaged_workflow_workflow().call_descriptor(store).await?, None)
            }
            Instance::V0_2(b) => {
                convert!(b.uncaged_workflow_workflow().call_descriptor(store).await?, None)
            }
            Instance::V0_3(b) => {
                let mut raw = b.uncaged_workflow_workflow().call_descriptor(store).await?;
                let input_schema = raw.input_schema.take();
                convert!(raw, input_schema)
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
            // 0.2.0 and 0.3.0 start a thread alike.
            Instance::V0_2(b) => start_v0_2!(b, v0_2, store, input),
            Instance::V0_3(b) => start_v0_2!(b, bindings, store, input),
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
            Instance::V0_2(b) => next_v0_2!(b, v0_2, store, self.thread),
            Instance::V0_3(b) => next_v0_2!(b, bindings, store, self.thread),
        })
    }
}
