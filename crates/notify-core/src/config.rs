//! Settings read from environment variables, with every problem collected so that a
//! misconfigured process names all bad variables in one go (exit code 64, `EX_USAGE` of
//! BSD `sysexits.h`, is the binaries' business). The reader takes the variables as a map,
//! so tests pass their own and never touch the process environment.

use std::collections::HashMap;
use std::fmt::Display;
use std::str::FromStr;

/// A required variable that is unset or blank. The reader has recorded it too, so a
/// caller that reads every variable first and calls [`Env::finish`] reports it with the
/// others; `?` on this error after `finish` cannot fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} is required")]
pub struct Missing(pub String);

/// Reads typed settings from a set of variables and collects every problem.
#[derive(Debug, Default)]
pub struct Env {
    vars: HashMap<String, String>,
    errors: Vec<String>,
}

impl Env {
    /// A reader over `vars` (name, value): `std::env::vars()` in a binary, a literal map
    /// in a test.
    pub fn from_vars<I, K, V>(vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Self {
            vars: vars
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            errors: Vec::new(),
        }
    }

    /// The raw value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// A required variable; an unset or blank one is recorded and returned as [`Missing`].
    pub fn required(&mut self, name: &str) -> Result<String, Missing> {
        match self.get(name) {
            Some(v) if !v.trim().is_empty() => Ok(v.to_string()),
            _ => {
                let missing = Missing(name.to_string());
                self.errors.push(missing.to_string());
                Err(missing)
            }
        }
    }

    /// An optional text variable with a default.
    pub fn string(&mut self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or(default).to_string()
    }

    /// An optional variable parsed with `FromStr`, with a default; a value that does not
    /// parse is recorded and the default returned.
    pub fn parse<T: FromStr>(&mut self, name: &str, default: T) -> T
    where
        T::Err: Display,
    {
        self.parse_with(name, default, |s| s.parse::<T>().map_err(|e| e.to_string()))
    }

    /// An optional variable parsed with `f` (given the trimmed value), with a default; a
    /// blank value counts as unset.
    pub fn parse_with<T>(
        &mut self,
        name: &str,
        default: T,
        f: impl FnOnce(&str) -> Result<T, String>,
    ) -> T {
        match self.get(name).map(str::to_string) {
            Some(v) if !v.trim().is_empty() => match f(v.trim()) {
                Ok(t) => t,
                Err(e) => {
                    self.errors
                        .push(format!("{name}={:?} is invalid: {e}", redact(&v)));
                    default
                }
            },
            _ => default,
        }
    }

    /// A required URL whose scheme is one of `schemes` (e.g. `["postgres", "postgresql"]`)
    /// and whose port, if given, is a number from 1 to 65535 (RFC 3986 authority).
    pub fn url(&mut self, name: &str, schemes: &[&str]) -> Result<String, Missing> {
        let v = self.required(name)?;
        self.check_url(name, &v, schemes);
        Ok(v)
    }

    /// A required comma-separated list of URLs (e.g. the nodes of a RabbitMQ cluster:
    /// `amqp://h1:5672/%2f,amqp://h2:5672/%2f`), each checked as [`Env::url`] checks one;
    /// an empty entry is an error naming its position (1-based). Returns the value as
    /// given.
    pub fn url_list(&mut self, name: &str, schemes: &[&str]) -> Result<String, Missing> {
        let v = self.required(name)?;
        for (i, one) in v.split(',').map(str::trim).enumerate() {
            if one.is_empty() {
                self.errors.push(format!(
                    "{name}={:?} is invalid: address {} of the comma-separated list is empty",
                    redact(&v),
                    i + 1
                ));
            } else {
                self.check_url(name, one, schemes);
            }
        }
        Ok(v)
    }

    /// An optional `http://` or `https://` base URL (a provider's API), with a default,
    /// without a trailing `/`.
    pub fn base_url(&mut self, name: &str, default: &str) -> String {
        let v = self.string(name, default);
        self.check_url(name, &v, &["http", "https"]);
        v.trim_end_matches('/').to_string()
    }

    fn check_url(&mut self, name: &str, v: &str, schemes: &[&str]) {
        let wanted: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
        let bad_scheme = || {
            format!(
                "{name}={:?} is invalid: must start with {}",
                redact(v),
                wanted.join(" or ")
            )
        };
        let Some((scheme, rest)) = v.split_once("://") else {
            self.errors.push(bad_scheme());
            return;
        };
        if !schemes.contains(&scheme.to_ascii_lowercase().as_str()) {
            self.errors.push(bad_scheme());
            return;
        }
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let host = host_port
            .rsplit_once(':')
            .filter(|(_, port)| !port.ends_with(']'))
            .map_or(host_port, |(host, _)| host);
        if host.is_empty() {
            self.errors
                .push(format!("{name}={:?} is invalid: names no host", redact(v)));
            return;
        }
        // A port after the last ':' (not inside an IPv6 literal's brackets).
        if let Some((_, port)) = host_port.rsplit_once(':')
            && !port.ends_with(']')
            && !port.parse::<u16>().is_ok_and(|p| p > 0)
        {
            self.errors.push(format!(
                "{name}={:?} is invalid: the port must be a number from 1 to 65535",
                redact(v)
            ));
        }
    }

    /// An optional whole number in `min..=max`, with a default.
    pub fn number<T>(&mut self, name: &str, default: T, min: T, max: T) -> T
    where
        T: FromStr + PartialOrd + Display + Copy,
    {
        self.parse_with(name, default, |s| match s.parse::<T>() {
            Ok(n) if n >= min && n <= max => Ok(n),
            _ => Err(format!("must be a whole number from {min} to {max}")),
        })
    }

    /// An optional duration (`500ms`, `30s`, `5m`, `2h`, `1d`; see
    /// [`crate::retry::parse_duration`]) in `min..=max`, with a default.
    pub fn duration(
        &mut self,
        name: &str,
        default: std::time::Duration,
        min: std::time::Duration,
        max: std::time::Duration,
    ) -> std::time::Duration {
        self.parse_with(name, default, |s| {
            crate::retry::parse_duration_in(s, min, max)
        })
    }

    /// Records a problem found while validating related settings.
    pub fn error(&mut self, message: impl Into<String>) {
        self.errors.push(message.into());
    }

    /// `Ok` when every variable was fine, else every problem, one per line, in the order
    /// they were found.
    pub fn finish(self) -> Result<(), String> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(self.errors.join("\n"))
        }
    }
}

/// `value` with the password of a URL's userinfo replaced by `***`
/// (`postgres://notify:***@db:5432/notify`), for error messages.
pub fn redact(value: &str) -> String {
    let Some((scheme, rest)) = value.split_once("://") else {
        return value.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let masked = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_string()
            };
            format!("{scheme}://{masked}@{host}{tail}")
        }
        None => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_never_echoed() {
        assert_eq!(
            redact("mysql://u:DbS3cretPw@127.0.0.1/db"),
            "mysql://u:***@127.0.0.1/db"
        );
        assert_eq!(redact("ftp://u:p@x"), "ftp://u:***@x");
        assert_eq!(redact("amqp://guest@h:5672/%2f"), "amqp://guest@h:5672/%2f");
        assert_eq!(redact("not a url"), "not a url");
    }

    #[test]
    fn every_bad_variable_is_reported_at_once() {
        let mut env = Env::from_vars([
            ("N", "70000"),
            ("DB", "mysql://u:pw@h/db"),
            ("BLANK", "  "),
            ("D", "5"),
        ]);
        let n: u32 = env.number("N", 1, 1, 65535);
        let db = env.url("DB", &["postgres"]);
        let blank = env.required("BLANK");
        let unset = env.required("UNSET");
        let d: u32 = env.parse("D", 1);
        assert_eq!((n, d), (1, 5));
        assert_eq!(db.as_deref(), Ok("mysql://u:pw@h/db"));
        assert_eq!(blank, Err(Missing("BLANK".into())));
        assert_eq!(unset, Err(Missing("UNSET".into())));
        assert_eq!(
            env.finish().unwrap_err(),
            "N=\"70000\" is invalid: must be a whole number from 1 to 65535\n\
             DB=\"mysql://u:***@h/db\" is invalid: must start with postgres://\n\
             BLANK is required\nUNSET is required"
        );
    }

    #[test]
    fn a_url_list_checks_every_address_and_names_an_empty_one() {
        let mut env = Env::from_vars([
            ("OK", "amqp://h1:5672/%2f, amqp://u:pw@h2:5673/%2f"),
            ("BAD", "amqp://h1:5672,,http://h3"),
        ]);
        assert_eq!(
            env.url_list("OK", &["amqp"]).as_deref(),
            Ok("amqp://h1:5672/%2f, amqp://u:pw@h2:5673/%2f")
        );
        env.url_list("BAD", &["amqp"]).unwrap();
        assert_eq!(
            env.finish().unwrap_err(),
            "BAD=\"amqp://h1:5672,,http://h3\" is invalid: address 2 of the comma-separated list is empty\n\
             BAD=\"http://h3\" is invalid: must start with amqp://"
        );
    }

    #[test]
    fn urls_need_a_host_and_a_port_in_range_and_base_urls_lose_the_slash() {
        let mut env = Env::from_vars([
            ("A", "http://:80/"),
            ("B", "http://h:0"),
            ("C", "https://api.line.me/"),
            ("E", "http://[::1]:8080"),
        ]);
        env.base_url("A", "");
        env.base_url("B", "");
        assert_eq!(env.base_url("C", ""), "https://api.line.me");
        assert_eq!(env.base_url("E", ""), "http://[::1]:8080");
        assert_eq!(env.base_url("F", "http://d/"), "http://d");
        assert_eq!(
            env.finish().unwrap_err(),
            "A=\"http://:80/\" is invalid: names no host\n\
             B=\"http://h:0\" is invalid: the port must be a number from 1 to 65535"
        );
    }
}
