//! Operator command line for the platform. Today it has one job, `demo`: the end-to-end
//! scenario of `make demo` (see [`demo`]).

pub mod demo;
