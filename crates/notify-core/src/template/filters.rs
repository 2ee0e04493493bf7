//! The filters templates may use: `money`, `date` and `datetime`, in the recipient's
//! locale and time zone (see the parent module's docs).

use super::language;
use chrono::{DateTime, Datelike, Timelike, Utc};
use minijinja::value::Value as JValue;
use minijinja::{Error, ErrorKind, State};

const TH_MONTHS: [&str; 12] = [
    "มกราคม",
    "กุมภาพันธ์",
    "มีนาคม",
    "เมษายน",
    "พฤษภาคม",
    "มิถุนายน",
    "กรกฎาคม",
    "สิงหาคม",
    "กันยายน",
    "ตุลาคม",
    "พฤศจิกายน",
    "ธันวาคม",
];
const TH_MONTHS_SHORT: [&str; 12] = [
    "ม.ค.",
    "ก.พ.",
    "มี.ค.",
    "เม.ย.",
    "พ.ค.",
    "มิ.ย.",
    "ก.ค.",
    "ส.ค.",
    "ก.ย.",
    "ต.ค.",
    "พ.ย.",
    "ธ.ค.",
];
const EN_MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

fn recipient_attr(state: &State, attr: &str, default: &str) -> String {
    state
        .lookup("recipient")
        .and_then(|r| r.get_attr(attr).ok())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| default.to_string())
}

/// `1234567.5` -> `1,234,567.50`.
pub(super) fn group_digits(amount: f64) -> String {
    let cents = (amount.abs() * 100.0).round() as u128;
    let (units, frac) = (cents / 100, cents % 100);
    let digits = units.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{}{out}.{frac:02}", if amount < 0.0 { "-" } else { "" })
}

pub(super) fn money(
    state: &State,
    value: JValue,
    currency: Option<String>,
) -> Result<String, Error> {
    let amount = match value.as_str() {
        Some(s) => s.replace(',', "").trim().parse::<f64>().ok(),
        None => f64::try_from(value.clone()).ok(),
    }
    .ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("money: {value} is not an amount"),
        )
    })?;
    let currency = currency
        .unwrap_or_else(|| "THB".into())
        .to_ascii_uppercase();
    let locale = recipient_attr(state, "locale", "th-TH");
    Ok(if language(&locale) == "th" && currency == "THB" {
        format!("{} บาท", group_digits(amount))
    } else {
        format!("{currency} {}", group_digits(amount))
    })
}

fn instant(value: &JValue) -> Option<DateTime<Utc>> {
    match value.as_str() {
        Some(s) => s.parse::<DateTime<Utc>>().ok(),
        None => i64::try_from(value.clone())
            .ok()
            .and_then(|s| DateTime::from_timestamp(s, 0)),
    }
}

pub(super) fn format_date(
    state: &State,
    value: JValue,
    style: &str,
    with_time: bool,
) -> Result<String, Error> {
    let at = instant(&value).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("date: {value} is not an RFC 3339 time or Unix seconds"),
        )
    })?;
    let tz = crate::validate::parse_timezone(&recipient_attr(state, "timezone", "Asia/Bangkok"))
        .unwrap_or(chrono_tz::Asia::Bangkok);
    let local = at.with_timezone(&tz);
    let m = local.month0() as usize;
    let thai = language(&recipient_attr(state, "locale", "th-TH")) == "th";
    let mut out = match (thai, style) {
        (true, "short") => format!(
            "{} {} {}",
            local.day(),
            TH_MONTHS_SHORT[m],
            local.year() + 543
        ),
        (true, _) => format!("{} {} {}", local.day(), TH_MONTHS[m], local.year() + 543),
        (false, "short") => format!("{} {} {}", local.day(), &EN_MONTHS[m][..3], local.year()),
        (false, _) => format!("{} {} {}", local.day(), EN_MONTHS[m], local.year()),
    };
    if with_time {
        out.push_str(&format!(" {:02}:{:02}", local.hour(), local.minute()));
        if thai {
            out.push_str(" น.");
        }
    }
    Ok(out)
}
