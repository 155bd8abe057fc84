//! How a stubbed method behaves: a latency (fixed, or log-normal from a p50 and a p99) and a fault
//! that fires with some probability. Built from `stub.v1.Behavior` (live `Configure`) or from a
//! command-line spec such as `wallet.Hold=latency:100,p99:400,fault:hang,prob:0.1`.

use std::str::FromStr;
use std::time::Duration;

use rand::Rng;

use super::method::{Method, Service, UnknownService};
use checkout_proto::stub::v1 as pb;

pub use pb::Fault;

/// The 99th percentile of the standard normal distribution.
const Z_P99: f64 = 2.3263;

/// The longest latency a sample may take (about 49 days): keeps the far tail finite.
const MAX_LATENCY_MS: f64 = u32::MAX as f64;

/// A `stub.v1.Behavior` that cannot be simulated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BehaviorError {
    /// The p99 is set but below the median.
    #[error("latency_p99_ms ({p99} ms) is below latency_ms ({p50} ms)")]
    P99BelowMedian {
        /// `latency_ms`.
        p50: u32,
        /// `latency_p99_ms`.
        p99: u32,
    },
    /// A p99 without a median: a log-normal needs a median above zero.
    #[error("latency_p99_ms ({0} ms) needs latency_ms above 0 (the median)")]
    P99WithoutMedian(u32),
    /// `fault_probability` outside `[0, 1]` (or NaN).
    #[error("fault_probability {0} is outside [0, 1]")]
    ProbabilityOutOfRange(f64),
    /// A `fault` value the enum does not define.
    #[error("unknown fault value {0}")]
    UnknownFault(i32),
}

impl BehaviorError {
    /// The `ConfigureRequest` field at fault, for `google.rpc.BadRequest`.
    pub fn field(&self) -> &'static str {
        match self {
            Self::P99BelowMedian { .. } | Self::P99WithoutMedian(_) => "behavior.latency_p99_ms",
            Self::ProbabilityOutOfRange(_) => "behavior.fault_probability",
            Self::UnknownFault(_) => "behavior.fault",
        }
    }
}

/// How long a call takes before it answers (or applies its effect).
#[derive(Debug, Clone, PartialEq)]
pub enum Latency {
    /// Always this long.
    Fixed(Duration),
    /// Log-normal: `ln(ms)` is normal with mean `mu = ln(p50)` and deviation
    /// `sigma = ln(p99 / p50) / z(0.99)`.
    LogNormal {
        /// The median, as configured.
        p50_ms: u32,
        /// The 99th percentile, as configured.
        p99_ms: u32,
        /// Mean of `ln(latency in ms)`.
        mu: f64,
        /// Standard deviation of `ln(latency in ms)`.
        sigma: f64,
    },
}

impl Default for Latency {
    fn default() -> Self {
        Self::Fixed(Duration::ZERO)
    }
}

impl Latency {
    /// A fixed latency of `latency_ms`, or a log-normal with that median when `latency_p99_ms`
    /// is not 0.
    pub fn new(latency_ms: u32, latency_p99_ms: u32) -> Result<Self, BehaviorError> {
        if latency_p99_ms == 0 {
            return Ok(Self::Fixed(Duration::from_millis(u64::from(latency_ms))));
        }
        if latency_p99_ms < latency_ms {
            return Err(BehaviorError::P99BelowMedian {
                p50: latency_ms,
                p99: latency_p99_ms,
            });
        }
        if latency_ms == 0 {
            return Err(BehaviorError::P99WithoutMedian(latency_p99_ms));
        }
        let (p50, p99) = (f64::from(latency_ms), f64::from(latency_p99_ms));
        Ok(Self::LogNormal {
            p50_ms: latency_ms,
            p99_ms: latency_p99_ms,
            mu: p50.ln(),
            sigma: (p99 / p50).ln() / Z_P99,
        })
    }

    /// One latency drawn from this distribution.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        match *self {
            Self::Fixed(latency) => latency,
            Self::LogNormal { mu, sigma, .. } => {
                let ms = (mu + sigma * standard_normal(rng))
                    .exp()
                    .clamp(0.0, MAX_LATENCY_MS);
                // `ms` is finite and non-negative (mu and sigma are finite, z is finite), so the
                // conversion cannot fail; the fallback only keeps this total.
                Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::ZERO)
            }
        }
    }

    fn to_millis(&self) -> (u32, u32) {
        match *self {
            Self::Fixed(latency) => (u32::try_from(latency.as_millis()).unwrap_or(u32::MAX), 0),
            Self::LogNormal { p50_ms, p99_ms, .. } => (p50_ms, p99_ms),
        }
    }
}

/// One standard normal variate (Box–Muller).
fn standard_normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    // `random::<f64>()` is in [0, 1), so `u1` is in (0, 1] and its logarithm is finite.
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// The behaviour of one stubbed method. The default answers at once, without fault.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Behavior {
    /// How long each call takes.
    latency: Latency,
    /// What goes wrong when the fault fires.
    fault: Fault,
    /// How often the fault fires; `None` means always.
    probability: Option<f64>,
}

/// What one call will do: drawn once on arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draw {
    /// How long to wait before answering or applying the effect.
    pub latency: Duration,
    /// The fault that fired for this call (`Fault::None` when none did).
    pub fault: Fault,
}

impl Behavior {
    /// A validated behaviour. `probability` `None` means the fault always fires.
    pub fn new(
        latency: Latency,
        fault: Fault,
        probability: Option<f64>,
    ) -> Result<Self, BehaviorError> {
        if let Some(p) = probability
            && !(0.0..=1.0).contains(&p)
        {
            return Err(BehaviorError::ProbabilityOutOfRange(p));
        }
        Ok(Self {
            latency,
            fault,
            probability,
        })
    }

    /// The latency distribution.
    pub fn latency(&self) -> &Latency {
        &self.latency
    }

    /// The configured fault mode.
    pub fn fault(&self) -> Fault {
        self.fault
    }

    /// How often the fault fires (`None`: always).
    pub fn probability(&self) -> Option<f64> {
        self.probability
    }

    /// Draws the latency and whether the fault fires for one call.
    pub fn draw<R: Rng + ?Sized>(&self, rng: &mut R) -> Draw {
        let latency = self.latency.sample(rng);
        let fires = match self.probability {
            None => true,
            // In [0, 1] by construction: 0 never fires (random() < 0 is false), 1 always does.
            Some(p) => rng.random::<f64>() < p,
        };
        let fault = if fires { self.fault } else { Fault::None };
        Draw { latency, fault }
    }
}

impl TryFrom<pb::Behavior> for Behavior {
    type Error = BehaviorError;

    fn try_from(value: pb::Behavior) -> Result<Self, Self::Error> {
        let fault =
            Fault::try_from(value.fault).map_err(|_| BehaviorError::UnknownFault(value.fault))?;
        let latency = Latency::new(value.latency_ms, value.latency_p99_ms)?;
        Self::new(latency, fault, value.fault_probability)
    }
}

impl From<&Behavior> for pb::Behavior {
    fn from(value: &Behavior) -> Self {
        let (latency_ms, latency_p99_ms) = value.latency.to_millis();
        Self {
            latency_ms,
            latency_p99_ms,
            fault: value.fault.into(),
            fault_probability: value.probability,
        }
    }
}

/// A behaviour for a service, or one of its methods, given on the command line as
/// `service[.Method]=key:value,...` with keys `latency` (ms), `p99` (ms),
/// `fault` (`none|unavailable|internal|hang|ambiguous`) and `prob` (0..1), e.g.
/// `wallet.Hold=latency:100,p99:400,fault:hang,prob:0.1` or `cart=latency:2300`.
#[derive(Debug, Clone, PartialEq)]
pub struct BehaviorSpec {
    /// The service it applies to.
    pub service: Service,
    /// The method it applies to; `None` for all the service's methods.
    pub method: Option<Method>,
    /// The behaviour.
    pub behavior: Behavior,
}

/// Why a command-line behaviour spec was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// No `=` between the target and the settings.
    #[error("expected service[.Method]=key:value,... (e.g. wallet.Hold=latency:100,fault:hang)")]
    MissingEquals,
    /// The service is not a stubbed one.
    #[error(transparent)]
    Service(#[from] UnknownService),
    /// The service has no such method.
    #[error("service {service} has no method {method:?} (expected one of {expected})")]
    UnknownMethod {
        /// The service named.
        service: Service,
        /// The method named.
        method: String,
        /// The service's RPC names.
        expected: String,
    },
    /// Nothing after `=`.
    #[error("no settings after '=' (expected key:value pairs: latency, p99, fault, prob)")]
    NoSettings,
    /// A setting without `:`.
    #[error("expected key:value, got {0:?}")]
    BadPair(String),
    /// A key other than `latency`, `p99`, `fault`, `prob`.
    #[error("unknown key {0:?} (expected latency, p99, fault or prob)")]
    UnknownKey(String),
    /// The same key twice.
    #[error("key {0:?} given twice")]
    DuplicateKey(String),
    /// A latency that is not a whole number of milliseconds.
    #[error("{key}: {value:?} is not a whole number of milliseconds")]
    BadMillis {
        /// `latency` or `p99`.
        key: &'static str,
        /// What was given.
        value: String,
    },
    /// A probability that is not a number.
    #[error("prob: {0:?} is not a number between 0 and 1")]
    BadProbability(String),
    /// A fault name that is not a fault.
    #[error("fault: unknown fault {0:?} (expected none, unavailable, internal, hang or ambiguous)")]
    UnknownFault(String),
    /// The settings parse but describe an impossible behaviour.
    #[error(transparent)]
    Invalid(#[from] BehaviorError),
}

impl FromStr for BehaviorSpec {
    type Err = SpecError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let (target, settings) = spec.split_once('=').ok_or(SpecError::MissingEquals)?;
        let (service, method) = match target.trim().split_once('.') {
            Some((service, method)) => (service, Some(method)),
            None => (target.trim(), None),
        };
        let service: Service = service.parse()?;
        let method = method
            .map(|name| {
                service
                    .method(name)
                    .ok_or_else(|| SpecError::UnknownMethod {
                        service,
                        method: name.to_owned(),
                        expected: service.method_names(),
                    })
            })
            .transpose()?;

        let settings = settings.trim();
        if settings.is_empty() {
            return Err(SpecError::NoSettings);
        }
        let mut latency: Option<u32> = None;
        let mut p99: Option<u32> = None;
        let mut fault: Option<Fault> = None;
        let mut prob: Option<f64> = None;
        for pair in settings.split(',') {
            let (key, value) = pair
                .split_once(':')
                .ok_or_else(|| SpecError::BadPair(pair.to_owned()))?;
            let (key, value) = (key.trim(), value.trim());
            let fresh = match key {
                "latency" => latency.replace(parse_millis("latency", value)?).is_none(),
                "p99" => p99.replace(parse_millis("p99", value)?).is_none(),
                "fault" => fault.replace(parse_fault(value)?).is_none(),
                "prob" => prob.replace(parse_probability(value)?).is_none(),
                other => return Err(SpecError::UnknownKey(other.to_owned())),
            };
            if !fresh {
                return Err(SpecError::DuplicateKey(key.to_owned()));
            }
        }
        let latency = Latency::new(latency.unwrap_or(0), p99.unwrap_or(0))?;
        let behavior = Behavior::new(latency, fault.unwrap_or(Fault::None), prob)?;
        Ok(Self {
            service,
            method,
            behavior,
        })
    }
}

fn parse_millis(key: &'static str, value: &str) -> Result<u32, SpecError> {
    value.parse().map_err(|_| SpecError::BadMillis {
        key,
        value: value.to_owned(),
    })
}

fn parse_probability(value: &str) -> Result<f64, SpecError> {
    let p: f64 = value
        .parse()
        .map_err(|_| SpecError::BadProbability(value.to_owned()))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(SpecError::BadProbability(value.to_owned()))
    }
}

fn parse_fault(value: &str) -> Result<Fault, SpecError> {
    match value.to_ascii_lowercase().as_str() {
        "none" => Ok(Fault::None),
        "unavailable" => Ok(Fault::Unavailable),
        "internal" => Ok(Fault::Internal),
        "hang" => Ok(Fault::Hang),
        "ambiguous" => Ok(Fault::Ambiguous),
        _ => Err(SpecError::UnknownFault(value.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn spec(s: &str) -> Result<BehaviorSpec, SpecError> {
        s.parse()
    }

    #[test]
    fn a_full_method_spec_parses_every_key() {
        let parsed = spec("wallet.Hold=latency:100,p99:400,fault:hang,prob:0.1").unwrap();
        assert_eq!(parsed.service, Service::Wallet);
        assert_eq!(parsed.method, Some(Method::WalletHold));
        assert_eq!(parsed.behavior.fault(), Fault::Hang);
        assert_eq!(parsed.behavior.probability(), Some(0.1));
        assert!(matches!(
            parsed.behavior.latency(),
            Latency::LogNormal {
                p50_ms: 100,
                p99_ms: 400,
                ..
            }
        ));
    }

    #[test]
    fn a_service_spec_applies_to_every_method_with_defaults_for_missing_keys() {
        let parsed = spec("cart=latency:2300").unwrap();
        assert_eq!(parsed.service, Service::Cart);
        assert_eq!(parsed.method, None);
        assert_eq!(
            parsed.behavior.latency(),
            &Latency::Fixed(Duration::from_millis(2300))
        );
        assert_eq!(parsed.behavior.fault(), Fault::None);
        assert_eq!(parsed.behavior.probability(), None);
        assert_eq!(
            spec(" inventory.Commit = fault:UNAVAILABLE ")
                .unwrap()
                .behavior
                .fault(),
            Fault::Unavailable
        );
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let err = |s: &str| spec(s).unwrap_err();
        assert_eq!(err("wallet"), SpecError::MissingEquals);
        assert_eq!(
            err("bank=latency:1"),
            SpecError::Service(UnknownService("bank".into()))
        );
        assert!(matches!(
            err("wallet.Score=latency:1"),
            SpecError::UnknownMethod { .. }
        ));
        assert!(
            err("wallet.Score=latency:1")
                .to_string()
                .contains("Hold, Capture, Release, LookupByReference")
        );
        assert_eq!(err("cart="), SpecError::NoSettings);
        assert_eq!(err("cart=latency"), SpecError::BadPair("latency".into()));
        assert_eq!(err("cart=delay:5"), SpecError::UnknownKey("delay".into()));
        assert_eq!(
            err("cart=latency:1,latency:2"),
            SpecError::DuplicateKey("latency".into())
        );
        assert!(matches!(
            err("cart=latency:-5"),
            SpecError::BadMillis { key: "latency", .. }
        ));
        assert!(matches!(
            err("cart=p99:1.5"),
            SpecError::BadMillis { key: "p99", .. }
        ));
        assert_eq!(
            err("cart=prob:1.5"),
            SpecError::BadProbability("1.5".into())
        );
        assert_eq!(err("cart=prob:x"), SpecError::BadProbability("x".into()));
        assert_eq!(
            err("cart=fault:slow"),
            SpecError::UnknownFault("slow".into())
        );
        assert_eq!(
            err("cart=latency:100,p99:50"),
            SpecError::Invalid(BehaviorError::P99BelowMedian { p50: 100, p99: 50 })
        );
        assert_eq!(
            err("cart=p99:50"),
            SpecError::Invalid(BehaviorError::P99WithoutMedian(50))
        );
    }

    #[test]
    fn proto_behaviours_are_validated() {
        let proto = |latency_ms, latency_p99_ms, fault_probability| pb::Behavior {
            latency_ms,
            latency_p99_ms,
            fault: Fault::Internal.into(),
            fault_probability,
        };
        assert!(Behavior::try_from(proto(100, 0, None)).is_ok());
        assert!(Behavior::try_from(proto(100, 100, Some(0.0))).is_ok());
        assert!(Behavior::try_from(proto(100, 400, Some(1.0))).is_ok());
        assert_eq!(
            Behavior::try_from(proto(100, 99, None)),
            Err(BehaviorError::P99BelowMedian { p50: 100, p99: 99 })
        );
        assert_eq!(
            Behavior::try_from(proto(0, 0, Some(-0.1))),
            Err(BehaviorError::ProbabilityOutOfRange(-0.1))
        );
        assert!(Behavior::try_from(proto(0, 0, Some(f64::NAN))).is_err());
        let unknown_fault = pb::Behavior {
            fault: 99,
            ..pb::Behavior::default()
        };
        assert_eq!(
            Behavior::try_from(unknown_fault),
            Err(BehaviorError::UnknownFault(99))
        );
    }

    #[test]
    fn a_behaviour_round_trips_through_its_proto() {
        let original = proto_round_trip(pb::Behavior {
            latency_ms: 120,
            latency_p99_ms: 900,
            fault: Fault::Ambiguous.into(),
            fault_probability: Some(0.25),
        });
        assert_eq!(original.latency_p99_ms, 900);
        assert_eq!(original.fault_probability, Some(0.25));
    }

    fn proto_round_trip(proto: pb::Behavior) -> pb::Behavior {
        let behavior = Behavior::try_from(proto).unwrap();
        pb::Behavior::from(&behavior)
    }

    #[test]
    fn log_normal_samples_hit_the_configured_median_and_p99() {
        let latency = Latency::new(100, 400).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let mut samples: Vec<Duration> = (0..20_000).map(|_| latency.sample(&mut rng)).collect();
        samples.sort();
        let p50 = samples[samples.len() / 2].as_secs_f64() * 1000.0;
        let p99 = samples[samples.len() * 99 / 100].as_secs_f64() * 1000.0;
        assert!((85.0..=115.0).contains(&p50), "p50 {p50} ms");
        assert!((340.0..=460.0).contains(&p99), "p99 {p99} ms");
    }

    #[test]
    fn fixed_latency_is_always_the_same() {
        let latency = Latency::new(250, 0).unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..100 {
            assert_eq!(latency.sample(&mut rng), Duration::from_millis(250));
        }
    }

    #[test]
    fn the_fault_fires_as_often_as_its_probability_says() {
        let mut rng = StdRng::seed_from_u64(3);
        let fires = |p: Option<f64>, rng: &mut StdRng| {
            let behavior = Behavior::new(Latency::default(), Fault::Unavailable, p).unwrap();
            (0..10_000)
                .filter(|_| behavior.draw(rng).fault == Fault::Unavailable)
                .count()
        };
        assert_eq!(fires(Some(0.0), &mut rng), 0);
        assert_eq!(fires(Some(1.0), &mut rng), 10_000);
        assert_eq!(fires(None, &mut rng), 10_000);
        let quarter = fires(Some(0.25), &mut rng);
        assert!((2_200..=2_800).contains(&quarter), "{quarter} of 10000");
    }
}
