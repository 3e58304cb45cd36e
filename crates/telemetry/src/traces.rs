//! Trace export over OTLP/HTTP (protobuf), configured the standard way: on when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and
//! `OTEL_SDK_DISABLED` is not `true`), a no-op otherwise. The exporter reads the other standard
//! variables itself (headers, timeout); `OTEL_SERVICE_NAME` defaults to `jobtrail`.

use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

/// The installed exporter, if any; [`Traces::shutdown`] flushes what is buffered.
pub struct Traces(Option<SdkTracerProvider>);

fn set(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.trim().is_empty())
}

/// Install the process's tracer provider from the environment. Blocking (the exporter's HTTP
/// client is a blocking one, run on the batch processor's own thread): call it outside the async
/// runtime or in `spawn_blocking`.
pub fn init() -> Result<Traces, String> {
    let endpoint =
        set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"));
    if endpoint.is_none()
        || set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return Ok(Traces(None));
    }
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(p) = set(var)
            && p != "http/protobuf"
        {
            return Err(format!(
                "{var}={p}: jobtrail exports traces over OTLP/HTTP with protobuf only (http/protobuf)"
            ));
        }
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("OTLP trace exporter: {e}"))?;
    let mut resource = Resource::builder();
    if set("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("jobtrail");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_id_generator(jobtrail_provider::spans::ChosenIds::default())
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    Ok(Traces(Some(provider)))
}

impl Traces {
    pub fn enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Flush and stop the exporter (blocking; bounded by the exporter's own timeout).
    pub fn shutdown(self) {
        if let Some(p) = self.0
            && let Err(e) = p.shutdown()
        {
            tracing::warn!(error = %e, "could not flush traces at shutdown");
        }
    }
}
