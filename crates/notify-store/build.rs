//! Rebuilds this crate when a migration is added or changed: `sqlx::migrate!` embeds
//! `migrations/` at compile time, and cargo does not see a new file in it otherwise (the
//! build script `sqlx migrate build-script` writes, per the sqlx-cli docs).

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
