//! The background tasks every ingest replica runs beside the gRPC API until shutdown,
//! each safe to run on any number of replicas at once: the sweeper ([`sweep`]), the
//! console counts' rollup ([`roll_up`]), the retention purge ([`purge`]) and the gauges
//! sampler ([`gauges`]). [`crate::run`] starts them; the relay and the event writer have
//! modules of their own.

pub(crate) mod gauges;
pub(crate) mod purge;
pub(crate) mod roll_up;
pub(crate) mod sweep;
