//! Operator command line for the platform: `demo` (the end-to-end scenario of
//! `make demo`, see [`demo`]) and `chaos` (the crash and outage test of `make chaos`,
//! see [`chaos`]); `erase-recipient` and `export-recipient` (the data rights calls, see
//! [`data`]).

pub mod bench;
pub mod chaos;
pub mod console_bench;
pub mod data;
pub mod demo;
pub mod keys;
pub mod observe;
pub mod procs;
pub mod receivers;
pub mod retention_soak;
