//! Traces over OpenTelemetry. A thread is one trace, whose id is the thread's ULID, so every
//! run of it (first, resumed, on any worker) lands in the same trace with nothing stored; the
//! thread's own span is exported when it ends, with the ids its runs already point at. Each
//! run in a worker is a span under it, each step a span under the run, each agent call a span
//! under its step with the GenAI semantic-convention attributes. Spans leave over OTLP
//! (HTTP/protobuf) through the SDK's batch processor: a bounded queue that drops, and counts
//! what it dropped, rather than make a thread wait for a slow or absent collector.

use std::time::{Duration, UNIX_EPOCH};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

use crate::ids::{BundleHash, ThreadId};

/// The `tracing` target of the spans that are exported; no other span or event is.
pub const TARGET: &str = "uncaged_workflow::telemetry";
/// The instrumentation scope spans are reported under.
const SCOPE: &str = "uncaged-workflow";
/// How long a process waits, at exit, for its last spans to leave: a collector that is down
/// must not hold a worker (or `step`) up for the exporter's whole timeout.
const FLUSH_AT_EXIT: Duration = Duration::from_secs(2);

/// The environment variables that turn export on (the standard ones), besides config.yaml's
/// `telemetry.otlp_endpoint`.
pub const ENDPOINT_ENV: [&str; 2] =
    ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"];

/// A process's span exporter, while traces are on.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// The exporter the standard `OTEL_*` variables ask for, or, when they name no endpoint,
    /// the one config.yaml names (`endpoint`, a base URL like the variable's). `None` when
    /// neither does, or when `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
    pub fn configured(endpoint: Option<&str>) -> Result<Option<Telemetry>, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return Ok(None);
        }
        if let Some(protocol) = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .filter(|p| p != "http/protobuf")
        {
            return Err(format!(
                "OTLP protocol `{protocol}` is not spoken here: traces go over http/protobuf \
                 (unset OTEL_EXPORTER_OTLP_PROTOCOL, or set it to http/protobuf)"
            ));
        }
        crate::http::install_tls();
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary);
        if !ENDPOINT_ENV.iter().any(|name| var(name).is_some()) {
            let Some(endpoint) = endpoint.filter(|e| !e.trim().is_empty()) else {
                return Ok(None);
            };
            // The variable's rule, applied to the config's base URL: the signal's path added.
            exporter =
                exporter.with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')));
        }
        let exporter = exporter.build().map_err(|e| format!("the OTLP trace exporter: {e}"))?;
        let mut resource = Resource::builder();
        if var("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("uncaged-workflow");
        }
        let provider = SdkTracerProvider::builder()
            .with_id_generator(ThreadSpanIds::default())
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        opentelemetry::global::set_tracer_provider(provider.clone());
        Ok(Some(Telemetry { provider }))
    }

    /// The `tracing` layer that turns this crate's spans (target [`TARGET`]) into exported
    /// ones, and nothing else: the log's events and spans stay in the log.
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer(SCOPE))
            // Spans are started when they get a child, not when entered: a step that turns out
            // to be the end of the run can still be named so. Nothing here reads the current
            // OpenTelemetry context (only `tracing`'s), and source locations, thread names and
            // busy/idle times are not worth their cost per step.
            .with_context_activation(false)
            .with_tracked_inactivity(false)
            .with_location(false)
            .with_threads(false)
            .with_filter(Targets::new().with_target(TARGET, tracing::Level::INFO))
    }

    /// Sends what is queued, waiting [`FLUSH_AT_EXIT`] at most. The SDK says, in the log, how
    /// many spans it dropped on a full queue, if any.
    pub fn shutdown(self) {
        let _ = self.provider.shutdown_with_timeout(FLUSH_AT_EXIT);
    }
}

/// The trace of `thread`: its ULID's 128 bits.
pub fn trace_id(thread: ThreadId) -> TraceId {
    TraceId::from_bytes(thread.to_u128().to_be_bytes())
}

/// The id of `thread`'s own span, derived from its id so that a run anywhere can name it as
/// parent before it is exported (at the thread's end).
fn thread_span_id(thread: ThreadId) -> SpanId {
    let bits = thread.to_u128();
    let id = (bits as u64) ^ ((bits >> 64) as u64).rotate_left(17);
    SpanId::from_bytes(id.max(1).to_be_bytes())
}

/// The ids of new spans: random, except for a thread's own span, whose ids are fixed (its
/// trace is the thread's, its id is [`thread_span_id`]): the SDK takes a span's ids from its
/// generator only, so the span exported at a thread's end asks for them here, on the OS
/// thread that builds it.
#[derive(Debug, Default)]
struct ThreadSpanIds(opentelemetry_sdk::trace::RandomIdGenerator);

thread_local! {
    /// The ids of the next span built on this OS thread, when they are a thread's own.
    static NEXT_IDS: std::cell::Cell<Option<(TraceId, SpanId)>> = const { std::cell::Cell::new(None) };
}

impl opentelemetry_sdk::trace::IdGenerator for ThreadSpanIds {
    fn new_trace_id(&self) -> TraceId {
        match NEXT_IDS.get() {
            Some((trace, _)) => trace,
            None => self.0.new_trace_id(),
        }
    }

    fn new_span_id(&self) -> SpanId {
        match NEXT_IDS.get() {
            Some((_, span)) => span,
            None => self.0.new_span_id(),
        }
    }
}

/// The thread's span as a remote parent.
fn thread_context(thread: ThreadId) -> Context {
    Context::new().with_remote_span_context(SpanContext::new(
        trace_id(thread),
        thread_span_id(thread),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    ))
}

/// The span of one run of a thread in this process, under the thread's span; `started_by` is
/// who asked for the thread from outside, if a request did (`mcp token:ci (claude-code)`).
pub fn run_span(
    thread: ThreadId,
    workflow: &str,
    hash: BundleHash,
    steps: usize,
    started_by: Option<&str>,
) -> tracing::Span {
    let span = tracing::info_span!(
        target: TARGET,
        "thread run",
        otel.name = %format_args!("run {workflow}"),
        uncaged.thread.id = %thread,
        uncaged.workflow.name = workflow,
        uncaged.workflow.hash = %hash,
        uncaged.run.first_step = steps as i64 + 1,
        uncaged.thread.started_by = started_by,
        uncaged.run.steps = Empty,
        uncaged.run.outcome = Empty,
    );
    // Fails only when the span is disabled (no exporter): nothing to parent then.
    let _ = span.set_parent(thread_context(thread));
    span
}

/// The span of a step (`index`, 1-based), under the current run: the bundle asked for it,
/// its agents called, its output checked. When the bundle yields no step but ends the run
/// (or waits), [`step_stopped`] renames it.
pub fn step_span(index: usize) -> tracing::Span {
    tracing::info_span!(
        target: TARGET,
        "step",
        otel.name = %format_args!("step {index}"),
        uncaged.step.index = index as i64,
        uncaged.step.outcome = Empty,
        uncaged.step.roles = Empty,
        uncaged.step.agents = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
    )
}

/// Says on a step's span what came instead of the step (`end`, `over budget`…), and names
/// the span so when no agent was called during it (a span with children keeps its name).
pub fn step_stopped(span: &tracing::Span, what: &'static str) {
    span.record("uncaged.step.outcome", what);
    span.record("otel.name", what);
}

/// What an agent call is, in the GenAI semantic conventions' words.
#[derive(Debug, Clone, Copy)]
pub struct AgentCall<'a> {
    /// `gen_ai.operation.name`: `chat` for a model, `invoke_agent` for the rest.
    pub operation: &'static str,
    /// `gen_ai.provider.name`: `openai` for an OpenAI-compatible endpoint; the binding's kind
    /// (`command`, `scripted`, `human`) otherwise.
    pub provider: &'static str,
    /// `gen_ai.request.model`, for a model.
    pub model: Option<&'a str>,
    /// The binding's name (`gen_ai.agent.name`) and the role it answers.
    pub agent: &'a str,
    pub role: &'a str,
}

/// The span of one agent call, under the current step.
pub fn agent_span(call: AgentCall<'_>) -> tracing::Span {
    tracing::info_span!(
        target: TARGET,
        "agent call",
        otel.name = %format_args!("{} {}", call.operation, call.model.unwrap_or(call.agent)),
        otel.kind = "client",
        otel.status_code = Empty,
        otel.status_description = Empty,
        gen_ai.operation.name = call.operation,
        gen_ai.provider.name = call.provider,
        gen_ai.request.model = call.model,
        gen_ai.agent.name = call.agent,
        uncaged.role = call.role,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.usage.cache_read.input_tokens = Empty,
        uncaged.cost_usd = Empty,
        error.type = Empty,
    )
}

/// The span of one model turn of a durable agent's call, under the call's span.
pub fn chat_span(provider: &'static str, model: &str, turn: u32) -> tracing::Span {
    tracing::info_span!(
        target: TARGET,
        "model turn",
        otel.name = %format_args!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        otel.status_description = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider,
        gen_ai.request.model = model,
        uncaged.turn = turn as i64,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.usage.cache_read.input_tokens = Empty,
        uncaged.cost_usd = Empty,
        error.type = Empty,
    )
}

/// The span of one tool call of a durable agent's call, under the call's span.
pub fn tool_span(name: &str, call_id: &str) -> tracing::Span {
    tracing::info_span!(
        target: TARGET,
        "tool call",
        otel.name = %format_args!("execute_tool {name}"),
        otel.kind = "internal",
        otel.status_code = Empty,
        otel.status_description = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = name,
        gen_ai.tool.call.id = call_id,
        gen_ai.tool.type = "extension",
        error.type = Empty,
    )
}

/// Tokens (and cost) on a step's or an agent call's span.
pub fn record_tokens(
    span: &tracing::Span,
    input: u64,
    output: u64,
    cached: u64,
    cost: Option<f64>,
) {
    // As signed integers: OTLP has no unsigned one, and the layer would send a `u64` as text.
    span.record("gen_ai.usage.input_tokens", input as i64);
    span.record("gen_ai.usage.output_tokens", output as i64);
    if cached > 0 {
        span.record("gen_ai.usage.cache_read.input_tokens", cached as i64);
    }
    if let Some(cost) = cost {
        span.record("uncaged.cost_usd", cost);
    }
}

/// Marks an agent call's span failed, with `error.type` (a short, fixed word such as
/// `timeout`) and the message.
pub fn record_failure(span: &tracing::Span, error_type: &'static str, message: &str) {
    span.record("error.type", error_type);
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", message);
}

/// The W3C `traceparent` of the current span, when it is exported: what an agent is handed
/// so that its own spans join the thread's trace.
pub fn traceparent() -> Option<String> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let span = span.span_context();
    span.is_valid().then(|| {
        format!("00-{}-{}-{:02x}", span.trace_id(), span.span_id(), span.trace_flags().to_u8())
    })
}

/// How a thread ended, for its span.
#[derive(Debug, Clone, Copy)]
pub struct ThreadEnd<'a> {
    pub thread: ThreadId,
    pub workflow: &'a str,
    pub hash: BundleHash,
    /// When the thread started (ms since the epoch): its span covers its whole life.
    pub started_ms: u64,
    pub status: &'a str,
    pub summary: &'a str,
    pub failed: bool,
    pub steps: usize,
    pub tokens: Option<(u64, u64)>,
    pub cost_usd: Option<f64>,
}

/// Exports the thread's own span, the parent its runs named, now that it has ended. Does
/// nothing when traces are off.
pub fn thread_ended(end: ThreadEnd<'_>) {
    let tracer = opentelemetry::global::tracer(SCOPE);
    let mut attributes = vec![
        KeyValue::new("uncaged.thread.id", end.thread.to_string()),
        KeyValue::new("uncaged.workflow.name", end.workflow.to_string()),
        KeyValue::new("uncaged.workflow.hash", end.hash.to_string()),
        KeyValue::new("uncaged.thread.status", end.status.to_string()),
        KeyValue::new("uncaged.thread.steps", end.steps as i64),
    ];
    if let Some((input, output)) = end.tokens {
        attributes.push(KeyValue::new("gen_ai.usage.input_tokens", input as i64));
        attributes.push(KeyValue::new("gen_ai.usage.output_tokens", output as i64));
    }
    if let Some(cost) = end.cost_usd {
        attributes.push(KeyValue::new("uncaged.cost_usd", cost));
    }
    let builder = tracer
        .span_builder(format!("thread {}", end.workflow))
        .with_start_time(UNIX_EPOCH + Duration::from_millis(end.started_ms))
        .with_attributes(attributes);
    // A root span: its trace id and its span id both come from the generator.
    NEXT_IDS.set(Some((trace_id(end.thread), thread_span_id(end.thread))));
    let mut span = tracer.build_with_context(builder, &Context::new());
    NEXT_IDS.set(None);
    if end.failed {
        span.set_status(Status::error(end.summary.to_string()));
    }
    span.end();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_trace_is_its_id_and_its_span_id_is_fixed_and_valid() {
        let thread = ThreadId::new();
        assert_eq!(format!("{}", trace_id(thread)), format!("{:032x}", thread.to_u128()));
        assert_eq!(thread_span_id(thread), thread_span_id(thread));
        assert_ne!(thread_span_id(thread), SpanId::INVALID);
        let other = ThreadId::new();
        assert_ne!(thread_span_id(thread), thread_span_id(other));
    }

    #[test]
    fn no_span_no_traceparent() {
        assert_eq!(traceparent(), None);
    }
}
