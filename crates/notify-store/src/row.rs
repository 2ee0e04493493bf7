//! Reading domain names out of rows: the one place where stored text becomes a
//! `notify_core` value. Text that does not parse is a [`StoreError::BadValue`], never a
//! panic.

use crate::{Result, StoreError};
use sqlx::Row;
use sqlx::postgres::PgRow;
use std::fmt::Display;
use std::str::FromStr;

/// Parses the text `value` read from `column`.
pub(crate) fn parse_text<T>(column: &'static str, value: &str) -> Result<T>
where
    T: FromStr,
    T::Err: Display,
{
    value.parse().map_err(|e: T::Err| StoreError::BadValue {
        column,
        message: e.to_string(),
    })
}

/// Reads the text column `column` of `row` and parses it.
pub(crate) fn parse<T>(row: &PgRow, column: &'static str) -> Result<T>
where
    T: FromStr,
    T::Err: Display,
{
    parse_text(column, row.try_get::<&str, _>(column)?)
}

/// Parses every element of a text-array column.
pub(crate) fn parse_all<T>(row: &PgRow, column: &'static str) -> Result<Vec<T>>
where
    T: FromStr,
    T::Err: Display,
{
    row.try_get::<Vec<String>, _>(column)?
        .iter()
        .map(|v| parse_text(column, v))
        .collect()
}

/// One column of a batch insert: `f` of every row, in order (bound as a Postgres array
/// and taken apart again with `UNNEST`).
pub(crate) fn column<'a, R, T>(rows: &'a [R], f: impl Fn(&'a R) -> T) -> Vec<T> {
    rows.iter().map(f).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify_core::{Channel, Priority};

    #[test]
    fn unreadable_text_is_a_bad_value_naming_column_and_value() {
        assert_eq!(
            parse_text::<Channel>("channel", "email").unwrap(),
            Channel::Email
        );
        let err = parse_text::<Priority>("priority", "urgent").unwrap_err();
        assert!(!err.is_transient());
        let text = err.to_string();
        assert!(
            text.contains("priority") && text.contains("\"urgent\""),
            "{text}"
        );
    }
}
