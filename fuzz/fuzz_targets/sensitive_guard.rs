//! The sensitive-data guard: scanning and masking never panic, and masked text carries
//! no national id or card number.
#![no_main]
use libfuzzer_sys::fuzz_target;
use notify_core::guard::{Kind, mask_text, scan_text};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let _ = scan_text(s);
    let masked = mask_text(s);
    let left = scan_text(&masked);
    assert!(
        !left.contains(&Kind::ThaiNationalId) && !left.contains(&Kind::PaymentCard),
        "{s:?} masked to {masked:?} still has {left:?}"
    );
});
