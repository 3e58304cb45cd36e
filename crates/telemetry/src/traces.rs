//! Trace export over OTLP/HTTP (protobuf), configured the standard way: on when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and
//! `OTEL_SDK_DISABLED` is not `true`, nor `OTEL_TRACES_EXPORTER` `none`), a no-op otherwise. The
//! exporter reads the other standard variables itself (headers, timeout); the service's name is
//! `OTEL_SERVICE_NAME`, else `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, else `jobtrail`. What
//! the SDK says of its own troubles (an export refused, spans dropped for a full queue) is logged
//! under the `opentelemetry_sdk` and `opentelemetry-otlp` targets: a collector that refuses every
//! export is seen in the log, not only in a trace that never comes. The sampler is
//! read here (`OTEL_TRACES_SAMPLER`, refused when unknown) and handed to the provider crate too, so
//! the flags of every context jobtrail builds, and of the `traceparent` providers receive, carry the
//! sampler's decision for the operation's trace.

use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};

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
    // The spec's list of exporters (`otlp`, the default; `none`): export when it names otlp (the
    // others it names, which jobtrail does not have, are said and left), none when it is `none`;
    // a list naming neither (a typo, `console` alone) is refused rather than taken for either.
    if let Some(e) = set("OTEL_TRACES_EXPORTER") {
        let named: Vec<String> = e
            .split(',')
            .map(|x| x.trim().to_ascii_lowercase())
            .filter(|x| !x.is_empty())
            .collect();
        if named.iter().all(|x| x == "none") {
            return Ok(Traces(None));
        }
        if !named.iter().any(|x| x == "otlp") {
            return Err(format!(
                "OTEL_TRACES_EXPORTER={e:?}: jobtrail exports traces with otlp (the default) or none"
            ));
        }
        for other in named.iter().filter(|x| *x != "otlp") {
            tracing::warn!(exporter = %other, "OTEL_TRACES_EXPORTER names an exporter jobtrail does not have: traces go to otlp only");
        }
    }
    // The traces' own setting wins over the general one, as the spec says.
    let protocol = [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ]
    .into_iter()
    .find_map(|var| set(var).map(|p| (var, p)));
    if let Some((var, p)) = protocol
        && !p.trim().eq_ignore_ascii_case("http/protobuf")
    {
        return Err(format!(
            "{var}={p}: jobtrail exports traces over OTLP/HTTP with protobuf only (http/protobuf)"
        ));
    }
    let sampler = sampler()?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("OTLP trace exporter: {e}"))?;
    // The builder has read OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES already: the default
    // name only where neither names the service (it would override them).
    let mut resource = Resource::builder();
    let named_in_attributes =
        set("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| names_the_service(&a));
    if set("OTEL_SERVICE_NAME").is_none() && !named_in_attributes {
        resource = resource.with_service_name("jobtrail");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler.clone())
        .with_id_generator(jobtrail_provider::spans::ChosenIds::default())
        .with_resource(resource.build())
        .build();
    jobtrail_provider::spans::set_sampler(sampler);
    opentelemetry::global::set_tracer_provider(provider.clone());
    Ok(Traces(Some(provider)))
}

/// Whether resource attributes (`OTEL_RESOURCE_ATTRIBUTES`: `key=value,…`) name the service.
fn names_the_service(attributes: &str) -> bool {
    attributes.split(',').any(|kv| {
        kv.split_once('=')
            .is_some_and(|(k, _)| k.trim() == "service.name")
    })
}

/// What an out-of-range or unparsable `OTEL_TRACES_SAMPLER_ARG` is told.
const RATIO_HELP: &str = "the share of operations whose traces are sampled, a number from 0 to 1 (0.25 samples a quarter of them)";

/// The sampler `OTEL_TRACES_SAMPLER` names (with `OTEL_TRACES_SAMPLER_ARG`, a ratio from 0 to 1,
/// for the `traceidratio` ones; 1 when unset); unset: `parentbased_always_on`. The spec's remote
/// samplers (`jaeger_remote`, `parentbased_jaeger_remote`, `xray`), which this SDK does not have,
/// fall back to the default with a warning, as the spec asks. Departing from it on purpose, a name
/// it does not list (a typo) or a ratio that is none is refused: the spec would ignore it, and a
/// fleet would sample everything while its operator believed otherwise.
fn sampler() -> Result<Sampler, String> {
    let ratio = || match set("OTEL_TRACES_SAMPLER_ARG") {
        None => Ok(1.0),
        Some(a) => a
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| format!("OTEL_TRACES_SAMPLER_ARG={a:?}: {RATIO_HELP}")),
    };
    let given = set("OTEL_TRACES_SAMPLER");
    let name = given.as_deref().map(|n| n.trim().to_ascii_lowercase());
    let default = || Sampler::ParentBased(Box::new(Sampler::AlwaysOn));
    Ok(match name.as_deref().unwrap_or("parentbased_always_on") {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::TraceIdRatioBased(ratio()?),
        "parentbased_always_on" => default(),
        "parentbased_always_off" => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        "parentbased_traceidratio" => {
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio()?)))
        }
        remote @ ("jaeger_remote" | "parentbased_jaeger_remote" | "xray") => {
            tracing::warn!(
                sampler = remote,
                "OTEL_TRACES_SAMPLER names a remote sampler jobtrail does not have: every operation is sampled (parentbased_always_on)"
            );
            default()
        }
        _ => {
            return Err(format!(
                "OTEL_TRACES_SAMPLER={:?}: jobtrail samples with always_on, always_off, traceidratio, parentbased_always_on (the default), parentbased_always_off or parentbased_traceidratio",
                given.unwrap_or_default()
            ));
        }
    })
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

#[cfg(test)]
mod tests {
    use super::names_the_service;

    /// A service named in the resource attributes keeps its name (the default would override it).
    #[test]
    fn the_service_named_in_resource_attributes_is_kept() {
        assert!(names_the_service("service.name=jobtrail-prod"));
        assert!(names_the_service(
            "deployment.environment=prod, service.name = jt"
        ));
        assert!(!names_the_service("service.namespace=payments,team=x"));
        assert!(!names_the_service("service.name"));
    }
}
