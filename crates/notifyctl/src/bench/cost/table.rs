//! The cost table: what one measured window cost, divided by the deliveries (or events) it
//! completed, as printed by `notifyctl bench`. Pure arithmetic and formatting; the samples
//! come from [`super`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Rows one table had written in the window, from `pg_stat_user_tables`
/// (`n_tup_ins`, `n_tup_upd`, `n_tup_del`, `n_tup_hot_upd`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TableWrites {
    /// Rows inserted.
    pub(crate) ins: i64,
    /// Rows updated (HOT or not).
    pub(crate) upd: i64,
    /// Rows deleted.
    pub(crate) del: i64,
    /// Updates that were heap-only (no index entry written).
    pub(crate) hot: i64,
}

impl TableWrites {
    /// `self - before`, counter by counter.
    pub(crate) fn since(&self, before: &TableWrites) -> TableWrites {
        TableWrites {
            ins: self.ins - before.ins,
            upd: self.upd - before.upd,
            del: self.del - before.del,
            hot: self.hot - before.hot,
        }
    }

    fn rows(&self) -> i64 {
        self.ins + self.upd + self.del
    }
}

/// One normalised statement from `pg_stat_statements` over the window.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Statement {
    /// Query text with constants as `$n`.
    pub(crate) query: String,
    /// Times executed.
    pub(crate) calls: i64,
    /// Total execution time, milliseconds.
    pub(crate) total_ms: f64,
    /// Rows returned or affected.
    pub(crate) rows: i64,
}

/// The statements of the window, or why they could not be counted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Statements {
    /// `pg_stat_statements.track` (`top` misses statements nested in functions).
    pub(crate) track: String,
    /// Every statement of the window except the bench's own.
    pub(crate) list: Vec<Statement>,
    /// Times `pg_stat_statements` dropped its least-used entries in the window
    /// (`pg_stat_statements_info.dealloc`, the whole cluster); when above zero, some of the
    /// window's statements may be missing.
    pub(crate) evictions: i64,
}

/// WAL written in the window, from the `pg_stat_wal` delta (the whole cluster).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Wal {
    /// WAL records.
    pub(crate) records: i64,
    /// Full-page images.
    pub(crate) fpi: i64,
    /// Bytes.
    pub(crate) bytes: i64,
}

/// Broker work in the window (the whole node), from RabbitMQ's global counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Broker {
    /// Messages published to the broker (`messages_received_total`).
    pub(crate) published: u64,
    /// Messages delivered to consumers (`messages_delivered_total`).
    pub(crate) delivered: u64,
    /// Messages acknowledged by consumers (`messages_acknowledged_total`).
    pub(crate) acked: u64,
}

/// What is being divided by: deliveries (end to end) or accepted events (ingest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// A delivery that reached a final state.
    Delivery,
    /// An event `CreateEvent` accepted.
    Event,
}

impl Unit {
    fn one(self) -> &'static str {
        match self {
            Unit::Delivery => "delivery",
            Unit::Event => "event",
        }
    }
    fn many(self) -> &'static str {
        match self {
            Unit::Delivery => "deliveries",
            Unit::Event => "events",
        }
    }
}

/// The processes whose CPU the table names, in the order printed.
pub(crate) const CPU_PROCESSES: [&str; 5] = [
    "ingest",
    "worker-inapp",
    "worker-line",
    "postgres",
    "rabbitmq",
];

/// Everything one window cost, in totals; [`Cost::render`] divides by `n`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cost {
    /// The phase, e.g. `end to end` or `ingest at 32 clients`.
    pub(crate) label: String,
    /// What `n` counts.
    pub(crate) unit: Unit,
    /// Deliveries (or events) completed in the window.
    pub(crate) n: u64,
    /// From `pg_stat_statements`, or the reason it is not available.
    pub(crate) statements: Result<Statements, String>,
    /// Per table, from `pg_stat_user_tables`.
    pub(crate) tables: BTreeMap<String, TableWrites>,
    /// From `pg_stat_wal`.
    pub(crate) wal: Wal,
    /// Committed transactions of the bench database (`pg_stat_database.xact_commit`), the
    /// bench's own already taken out.
    pub(crate) xacts: i64,
    /// The bench's own transactions that were taken out of `xacts`.
    pub(crate) own_xacts: u64,
    /// From RabbitMQ, or the reason it is not available.
    pub(crate) broker: Result<Broker, String>,
    /// CPU milliseconds per process (see [`CPU_PROCESSES`]); `None` when not running.
    pub(crate) cpu_ms: Vec<(&'static str, Option<f64>)>,
}

/// A per-unit figure: three decimals below 1, two below 10, one below 100, none above.
pub(crate) fn num(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.abs() < 1.0 {
        format!("{x:.3}")
    } else if x.abs() < 10.0 {
        format!("{x:.2}")
    } else if x.abs() < 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.0}")
    }
}

/// `part` as a whole percentage of `whole`; `None` when `whole` is zero.
pub(crate) fn percent(part: i64, whole: i64) -> Option<f64> {
    (whole > 0).then(|| 100.0 * part as f64 / whole as f64)
}

/// Query text on one line (whitespace runs collapsed), at most `max` characters, ending in
/// `…` when cut (after the last non-blank character kept).
pub(crate) fn truncate(query: &str, max: usize) -> String {
    let one_line = query.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        return one_line;
    }
    let cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
    format!("{}…", cut.trim_end())
}

/// How many statements the summary line names, and how many each list shows.
const TOP_LINE: usize = 5;
const TOP_LIST: usize = 10;

impl Cost {
    fn per(&self, x: f64) -> f64 {
        x / self.n.max(1) as f64
    }

    /// The summary line, the per-table breakdown, the top statements by calls and by total
    /// time, and where each figure came from.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let per = |x: f64| num(self.per(x));
        let total = self
            .tables
            .values()
            .fold(TableWrites::default(), |a, t| TableWrites {
                ins: a.ins + t.ins,
                upd: a.upd + t.upd,
                del: a.del + t.del,
                hot: a.hot + t.hot,
            });
        let statements = match &self.statements {
            Ok(s) => {
                let calls: i64 = s.list.iter().map(|q| q.calls).sum();
                let top: Vec<String> = by_calls(&s.list)
                    .take(TOP_LINE)
                    .map(|q| format!("{} {}", per(q.calls as f64), truncate(&q.query, 40)))
                    .collect();
                format!(
                    "{} statements (top 5: {})",
                    per(calls as f64),
                    top.join("; ")
                )
            }
            Err(why) => format!("statements: n/a ({why})"),
        };
        let hot = match percent(total.hot, total.upd) {
            Some(p) => format!("{p:.0}% HOT updates"),
            None => "HOT updates n/a (no updates)".into(),
        };
        let broker = match &self.broker {
            Ok(b) => format!(
                "{} broker messages (published; delivered {}, acked {})",
                per(b.published as f64),
                per(b.delivered as f64),
                per(b.acked as f64)
            ),
            Err(why) => format!("broker messages: n/a ({why})"),
        };
        let cpu: Vec<String> = self
            .cpu_ms
            .iter()
            .map(|(name, ms)| match ms {
                Some(ms) => format!("{name} {}", per(*ms)),
                None => format!("{name} n/a"),
            })
            .collect();
        let _ = writeln!(
            out,
            "cost per {} ({}, {} {}): {statements}, {} rows written ({} ins / {} upd / {} del), {hot}, {} WAL bytes ({} full-page images), {} transactions, {broker}, CPU ms: {}",
            self.unit.one(),
            self.label,
            self.n,
            self.unit.many(),
            per(total.rows() as f64),
            per(total.ins as f64),
            per(total.upd as f64),
            per(total.del as f64),
            per(self.wal.bytes as f64),
            per(self.wal.fpi as f64),
            per(self.xacts as f64),
            cpu.join(", ")
        );
        let mut tables: Vec<(&String, &TableWrites)> =
            self.tables.iter().filter(|(_, t)| t.rows() > 0).collect();
        tables.sort_by(|a, b| b.1.rows().cmp(&a.1.rows()).then(a.0.cmp(b.0)));
        let _ = writeln!(
            out,
            "  rows per {} by table: inserted / updated / deleted, HOT % of updates",
            self.unit.one()
        );
        for (name, t) in tables {
            let hot = percent(t.hot, t.upd).map_or("-".into(), |p| format!("{p:.0}%"));
            let _ = writeln!(
                out,
                "    {name:<32} {:>7} / {:>7} / {:>7}  HOT {hot}",
                per(t.ins as f64),
                per(t.upd as f64),
                per(t.del as f64)
            );
        }
        if let Ok(s) = &self.statements {
            let mut by_time: Vec<&Statement> = s.list.iter().collect();
            by_time.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
            for (title, list) in [
                (
                    "calls",
                    by_calls(&s.list).take(TOP_LIST).collect::<Vec<_>>(),
                ),
                ("total time", by_time.into_iter().take(TOP_LIST).collect()),
            ] {
                let _ = writeln!(
                    out,
                    "  top statements by {title} (per {}: calls, ms, rows; query):",
                    self.unit.one()
                );
                for q in list {
                    let _ = writeln!(
                        out,
                        "    {:>6} {:>8} {:>6}  {}",
                        per(q.calls as f64),
                        num(self.per(q.total_ms)),
                        per(q.rows as f64),
                        truncate(&q.query, 80)
                    );
                }
            }
        }
        let track = match &self.statements {
            Ok(s) if s.evictions > 0 => format!(
                "pg_stat_statements of this database (track={}, the bench's own queries left out; it evicted entries {} times in the window, so statements may be missing: raise pg_stat_statements.max)",
                s.track, s.evictions
            ),
            Ok(s) => format!(
                "pg_stat_statements of this database (track={}, the bench's own queries left out)",
                s.track
            ),
            Err(_) => "no pg_stat_statements".into(),
        };
        let broker_src = if self.broker.is_ok() {
            "RabbitMQ global counters via rabbitmqctl (whole node)"
        } else {
            "no broker counters"
        };
        let _ = write!(
            out,
            "  from: {track}; pg_stat_user_tables; pg_stat_database xact_commit ({} of the bench's own left out); pg_stat_wal (whole cluster); {broker_src}; /proc CPU time of each process tree",
            self.own_xacts
        );
        out
    }
}

/// Statements by calls, most first (ties by text, so the order is stable).
fn by_calls(list: &[Statement]) -> impl Iterator<Item = &Statement> {
    let mut v: Vec<&Statement> = list.iter().collect();
    v.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.query.cmp(&b.query)));
    v.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(statements: Result<Statements, String>) -> Cost {
        let mut tables = BTreeMap::new();
        tables.insert(
            "notification_deliveries".to_string(),
            TableWrites {
                ins: 1000,
                upd: 3000,
                del: 0,
                hot: 750,
            },
        );
        tables.insert(
            "outbox".to_string(),
            TableWrites {
                ins: 1000,
                upd: 0,
                del: 1000,
                hot: 0,
            },
        );
        tables.insert("untouched".to_string(), TableWrites::default());
        Cost {
            label: "end to end".into(),
            unit: Unit::Delivery,
            n: 1000,
            statements,
            tables,
            wal: Wal {
                records: 9000,
                fpi: 120,
                bytes: 2_345_000,
            },
            xacts: 3100,
            own_xacts: 12,
            broker: Ok(Broker {
                published: 1000,
                delivered: 1010,
                acked: 1000,
            }),
            cpu_ms: vec![
                ("ingest", Some(410.0)),
                ("worker-inapp", Some(220.0)),
                ("worker-line", None),
                ("postgres", Some(1234.0)),
                ("rabbitmq", Some(305.0)),
            ],
        }
    }

    fn statements() -> Statements {
        let q = |query: &str, calls, total_ms, rows| Statement {
            query: query.into(),
            calls,
            total_ms,
            rows,
        };
        Statements {
            track: "all".into(),
            evictions: 0,
            list: vec![
                q(
                    "UPDATE notification_deliveries SET status = $1, attempts = attempts + $2 WHERE id = ANY($3) AND status = $4",
                    2000,
                    900.0,
                    2000,
                ),
                q(
                    "INSERT INTO outbox (delivery_id, channel) VALUES ($1, $2)",
                    1000,
                    150.0,
                    1000,
                ),
                q(
                    "DELETE FROM outbox WHERE delivery_id = $1",
                    1000,
                    2500.0,
                    1000,
                ),
                q("COMMIT", 3100, 5.0, 0),
            ],
        }
    }

    #[test]
    fn divides_every_total_by_the_deliveries_of_the_window() {
        let out = cost(Ok(statements())).render();
        let line = out.lines().next().unwrap();
        assert_eq!(
            line,
            "cost per delivery (end to end, 1000 deliveries): 7.10 statements (top 5: 3.10 COMMIT; 2.00 UPDATE notification_deliveries SET stat…; 1.00 DELETE FROM outbox WHERE delivery_id =…; 1.00 INSERT INTO outbox (delivery_id, channe…), \
             6.00 rows written (2.00 ins / 3.00 upd / 1.00 del), 25% HOT updates, 2345 WAL bytes (0.120 full-page images), 3.10 transactions, \
             1.00 broker messages (published; delivered 1.01, acked 1.00), CPU ms: ingest 0.410, worker-inapp 0.220, worker-line n/a, postgres 1.23, rabbitmq 0.305"
        );
    }

    #[test]
    fn breaks_rows_down_by_table_and_lists_the_top_statements() {
        let out = cost(Ok(statements())).render();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[1],
            "  rows per delivery by table: inserted / updated / deleted, HOT % of updates"
        );
        // Most rows first; a table without writes is left out.
        assert_eq!(
            lines[2],
            "    notification_deliveries             1.00 /    3.00 /       0  HOT 25%"
        );
        assert_eq!(
            lines[3],
            "    outbox                              1.00 /       0 /    1.00  HOT -"
        );
        assert_eq!(
            lines[4],
            "  top statements by calls (per delivery: calls, ms, rows; query):"
        );
        assert_eq!(lines[5], "      3.10    0.005      0  COMMIT");
        assert_eq!(
            lines[6],
            "      2.00    0.900   2.00  UPDATE notification_deliveries SET status = $1, attempts = attempts + $2 WHERE…"
        );
        let by_time = lines
            .iter()
            .position(|l| l.starts_with("  top statements by total time"))
            .unwrap();
        assert_eq!(
            lines[by_time + 1],
            "      1.00     2.50   1.00  DELETE FROM outbox WHERE delivery_id = $1"
        );
        assert!(lines.last().unwrap().starts_with(
            "  from: pg_stat_statements of this database (track=all, the bench's own queries left out); pg_stat_user_tables; pg_stat_database xact_commit (12 of the bench's own left out)"
        ));
    }

    #[test]
    fn says_when_pg_stat_statements_evicted_entries_in_the_window() {
        let mut s = statements();
        s.evictions = 2;
        let out = cost(Ok(s)).render();
        assert!(out.contains("\n  from: pg_stat_statements of this database (track=all, the bench's own queries left out; it evicted entries 2 times in the window, so statements may be missing: raise pg_stat_statements.max); "), "{out}");
    }

    #[test]
    fn without_pg_stat_statements_prints_the_rest() {
        let mut c = cost(Err("pg_stat_statements not loaded".into()));
        c.broker = Err("rabbitmqctl not found".into());
        let out = c.render();
        let line = out.lines().next().unwrap();
        assert!(
            line.starts_with(
                "cost per delivery (end to end, 1000 deliveries): statements: n/a (pg_stat_statements not loaded), 6.00 rows written"
            ),
            "{line}"
        );
        assert!(
            line.contains("broker messages: n/a (rabbitmqctl not found), CPU ms: ingest 0.410")
        );
        assert!(!out.contains("top statements"), "{out}");
    }

    #[test]
    fn hot_share_is_not_a_number_without_updates_and_counts_per_event_for_ingest() {
        let mut c = cost(Ok(statements()));
        c.unit = Unit::Event;
        c.label = "ingest at 32 clients".into();
        c.n = 0;
        c.tables.get_mut("notification_deliveries").unwrap().upd = 0;
        c.tables.get_mut("notification_deliveries").unwrap().hot = 0;
        let line = c.render().lines().next().unwrap().to_string();
        assert!(
            line.starts_with("cost per event (ingest at 32 clients, 0 events): "),
            "{line}"
        );
        // n = 0 divides by one rather than printing infinities.
        assert!(
            line.contains(
                ", 3000 rows written (2000 ins / 0 upd / 1000 del), HOT updates n/a (no updates), "
            ),
            "{line}"
        );
    }

    #[test]
    fn truncation_counts_characters_and_collapses_whitespace() {
        assert_eq!(truncate("SELECT  1\n   FROM t", 80), "SELECT 1 FROM t");
        let thai = "ทดสอบ".repeat(20);
        let cut = truncate(&thai, 80);
        assert_eq!(cut.chars().count(), 80);
        assert!(cut.ends_with('…'));
        assert_eq!(truncate(&"x".repeat(80), 80), "x".repeat(80));
    }

    #[test]
    fn per_unit_figures_keep_two_or_three_digits_when_small() {
        assert_eq!(num(0.0), "0");
        assert_eq!(num(0.0041), "0.004");
        assert_eq!(num(0.18), "0.180");
        assert_eq!(num(7.1), "7.10");
        assert_eq!(num(23.44), "23.4");
        assert_eq!(num(2345.0), "2345");
        assert_eq!(percent(750, 3000), Some(25.0));
        assert_eq!(percent(0, 0), None);
    }
}
