//! When a schedule fires: its cron in its time zone ([`Timing`]), and what the scheduler does
//! with the fire times that are due when it looks ([`plan`]): pure functions of the times,
//! tested without a clock.

use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// A fire time at most this late is on time (the scheduler's own delay).
pub const ON_TIME_MS: i64 = 1_000;
/// A fire time later than [`ON_TIME_MS`] is missed, unless it is the only one due and at most
/// this late: then it fires late, as scheduled.
pub const GRACE_MS: i64 = 60_000;
/// `catch_up` fires at most this many missed times (the most recent ones); the older ones are
/// recorded as one skipped fire.
pub const MAX_CATCH_UP: usize = 100;
/// Missed times are counted up to this many (a cron every second over a long stop).
const MAX_COUNTED: u64 = 100_000;

/// What to do about fire times missed while no scheduler ran (or while paused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misfire {
    /// Record one skipped fire saying how many were missed; go on from the next future time.
    Skip,
    /// Fire once now.
    RunOnce,
    /// Fire each missed time in order (the most recent [`MAX_CATCH_UP`]).
    CatchUp,
}

impl Misfire {
    pub fn as_str(self) -> &'static str {
        match self {
            Misfire::Skip => "skip",
            Misfire::RunOnce => "run_once",
            Misfire::CatchUp => "catch_up",
        }
    }

    pub fn parse(text: &str) -> Option<Misfire> {
        match text {
            "skip" => Some(Misfire::Skip),
            "run_once" => Some(Misfire::RunOnce),
            "catch_up" => Some(Misfire::CatchUp),
            _ => None,
        }
    }
}

/// What a fire does while the previous fire's run is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    Skip,
    Queue,
    Allow,
}

impl Overlap {
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Queue => "queue",
            Overlap::Allow => "allow",
        }
    }

    pub fn parse(text: &str) -> Option<Overlap> {
        match text {
            "skip" => Some(Overlap::Skip),
            "queue" => Some(Overlap::Queue),
            "allow" => Some(Overlap::Allow),
            _ => None,
        }
    }
}

/// Why a fire happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The cron's time, on time.
    Scheduled,
    /// `POST /v1/schedules/{id}/trigger`.
    Manual,
    /// A missed time, fired late by the misfire policy.
    CatchUp,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Scheduled => "scheduled",
            Trigger::Manual => "manual",
            Trigger::CatchUp => "catch_up",
        }
    }
}

/// A cron in a time zone.
#[derive(Debug, Clone)]
pub struct Timing {
    cron: Cron,
    zone: Tz,
}

/// Which input of a timing is wrong, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimingError {
    pub field: &'static str,
    pub detail: String,
}

impl Timing {
    /// A cron of 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds first),
    /// and an IANA time zone name.
    pub fn parse(cron: &str, timezone: &str) -> Result<Timing, TimingError> {
        let zone = Tz::from_str(timezone).map_err(|_| TimingError {
            field: "timezone",
            detail: format!(
                "{timezone:?} is not an IANA time zone (such as \"Europe/Paris\" or \"UTC\")"
            ),
        })?;
        let fields = cron.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(TimingError {
                field: "cron",
                detail: format!(
                    "{cron:?} has {fields} fields: 5 (minute hour day month weekday) or 6 \
                     (seconds first)"
                ),
            });
        }
        let parsed = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(cron)
            .map_err(|e| TimingError {
                field: "cron",
                detail: format!("{cron:?} is not a valid cron expression: {e}"),
            })?;
        let timing = Timing { cron: parsed, zone };
        if timing.next_after(Utc::now().timestamp_millis()).is_none() {
            return Err(TimingError {
                field: "cron",
                detail: format!("{cron:?} never fires"),
            });
        }
        Ok(timing)
    }

    /// The first fire time strictly after `after` (Unix ms), if there is one.
    pub fn next_after(&self, after: i64) -> Option<i64> {
        let start = self.zone.from_utc_datetime(&utc(after)?.naive_utc());
        self.cron
            .find_next_occurrence(&start, false)
            .ok()
            .map(|next| next.timestamp_millis())
    }
}

fn utc(ms: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms)
}

/// What the scheduler does about a schedule whose next fire time `due` is at or before `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The fires to make, in order: their time, trigger and how many missed times each
    /// accounts for beyond itself.
    pub fires: Vec<PlannedFire>,
    /// A skipped fire to record (at the first missed time) and how many times it skipped.
    pub skipped: Option<(i64, i64)>,
    /// The schedule's next fire time after this (strictly after `now`).
    pub next: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedFire {
    pub at: i64,
    pub trigger: Trigger,
    pub missed: i64,
}

/// The plan for the fire times due at `now` from `due` on. Those at most [`ON_TIME_MS`] late
/// fire as scheduled; so does a single later one at most [`GRACE_MS`] late. The others were
/// missed (the scheduler was not running, or the schedule was paused), and `misfire` says what
/// happens to them; the on-time ones fire after that.
pub fn plan(timing: &Timing, misfire: Misfire, due: i64, now: i64) -> Plan {
    // The missed times (counted; the last MAX_CATCH_UP kept), then the on-time ones.
    let mut count: u64 = 0;
    let mut recent = std::collections::VecDeque::new();
    let mut on_time = Vec::new();
    let mut at = Some(due);
    while let Some(t) = at.filter(|&t| t <= now) {
        if now - t <= ON_TIME_MS {
            on_time.push(t);
        } else {
            count += 1;
            recent.push_back(t);
            if recent.len() > MAX_CATCH_UP {
                recent.pop_front();
            }
            if count >= MAX_COUNTED {
                break;
            }
        }
        at = timing.next_after(t);
    }
    let next = timing.next_after(now);
    let scheduled = |t: i64| PlannedFire {
        at: t,
        trigger: Trigger::Scheduled,
        missed: 0,
    };
    if count == 1 && now - due <= GRACE_MS {
        on_time.insert(0, due);
        return Plan {
            fires: on_time.into_iter().map(scheduled).collect(),
            skipped: None,
            next,
        };
    }
    let missed = i64::try_from(count).unwrap_or(i64::MAX);
    let mut plan = Plan {
        fires: Vec::new(),
        skipped: None,
        next,
    };
    if let Some(&last) = recent.back() {
        match misfire {
            Misfire::Skip => plan.skipped = Some((due, missed)),
            Misfire::RunOnce => plan.fires.push(PlannedFire {
                at: last,
                trigger: Trigger::CatchUp,
                missed: missed - 1,
            }),
            Misfire::CatchUp => {
                let dropped = missed - recent.len() as i64;
                plan.skipped = (dropped > 0).then_some((due, dropped));
                plan.fires.extend(recent.into_iter().map(|at| PlannedFire {
                    at,
                    trigger: Trigger::CatchUp,
                    missed: 0,
                }));
            }
        }
    }
    plan.fires.extend(on_time.into_iter().map(scheduled));
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> i64 {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .timestamp_millis()
    }

    #[test]
    fn five_and_six_fields_in_a_time_zone() {
        let daily = Timing::parse("30 9 * * *", "Europe/Paris").unwrap();
        // 09:30 in Paris is 08:30 UTC in winter, 07:30 UTC in summer.
        assert_eq!(
            daily.next_after(ms("2026-01-10T12:00:00Z")),
            Some(ms("2026-01-11T08:30:00Z"))
        );
        assert_eq!(
            daily.next_after(ms("2026-07-10T06:00:00Z")),
            Some(ms("2026-07-10T07:30:00Z"))
        );
        let every_second = Timing::parse("* * * * * *", "UTC").unwrap();
        assert_eq!(
            every_second.next_after(ms("2026-01-10T12:00:00.500Z")),
            Some(ms("2026-01-10T12:00:01Z"))
        );
        assert_eq!(
            every_second.next_after(ms("2026-01-10T12:00:01Z")),
            Some(ms("2026-01-10T12:00:02Z"))
        );
    }

    #[test]
    fn bad_input_names_its_field() {
        assert_eq!(Timing::parse("* * * *", "UTC").unwrap_err().field, "cron");
        assert_eq!(
            Timing::parse("* * * * * * *", "UTC").unwrap_err().field,
            "cron"
        );
        assert_eq!(
            Timing::parse("61 * * * *", "UTC").unwrap_err().field,
            "cron"
        );
        assert_eq!(Timing::parse("nope", "UTC").unwrap_err().field, "cron");
        assert_eq!(
            Timing::parse("* * * * *", "Mars/Olympus")
                .unwrap_err()
                .field,
            "timezone"
        );
    }

    #[test]
    fn one_due_time_on_time_fires_as_scheduled() {
        let t = Timing::parse("0 * * * *", "UTC").unwrap();
        let due = ms("2026-01-10T12:00:00Z");
        let plan = plan(&t, Misfire::Skip, due, due + 300);
        assert_eq!(
            plan.fires,
            vec![PlannedFire {
                at: due,
                trigger: Trigger::Scheduled,
                missed: 0
            }]
        );
        assert_eq!(plan.skipped, None);
        assert_eq!(plan.next, Some(ms("2026-01-10T13:00:00Z")));
    }

    #[test]
    fn a_stop_over_several_times_follows_the_misfire_policy() {
        let t = Timing::parse("0 * * * *", "UTC").unwrap();
        let due = ms("2026-01-10T12:00:00Z");
        // Stopped from before 12:00 until 16:30: 12, 13, 14, 15 and 16 o'clock were missed.
        let now = ms("2026-01-10T16:30:00Z");
        let next = Some(ms("2026-01-10T17:00:00Z"));
        let skip = plan(&t, Misfire::Skip, due, now);
        assert_eq!(skip.fires, vec![]);
        assert_eq!(skip.skipped, Some((due, 5)));
        assert_eq!(skip.next, next);
        let once = plan(&t, Misfire::RunOnce, due, now);
        assert_eq!(
            once.fires,
            vec![PlannedFire {
                at: ms("2026-01-10T16:00:00Z"),
                trigger: Trigger::CatchUp,
                missed: 4
            }]
        );
        assert_eq!(once.next, next);
        let all = plan(&t, Misfire::CatchUp, due, now);
        let times: Vec<i64> = all.fires.iter().map(|f| f.at).collect();
        assert_eq!(
            times,
            (12..=16)
                .map(|h| ms(&format!("2026-01-10T{h}:00:00Z")))
                .collect::<Vec<_>>()
        );
        assert!(all.fires.iter().all(|f| f.trigger == Trigger::CatchUp));
        assert_eq!(all.skipped, None);
    }

    #[test]
    fn one_time_missed_by_more_than_the_grace_is_a_misfire() {
        let t = Timing::parse("0 * * * *", "UTC").unwrap();
        let due = ms("2026-01-10T12:00:00Z");
        let late = plan(&t, Misfire::Skip, due, due + GRACE_MS + 1);
        assert_eq!(late.skipped, Some((due, 1)));
        assert!(late.fires.is_empty());
    }

    #[test]
    fn times_at_most_a_second_late_are_on_time() {
        let t = Timing::parse("* * * * * *", "UTC").unwrap();
        let due = ms("2026-01-10T12:00:00Z");
        // The scheduler looked 1.2 s after 12:00:00: 12:00:01 is on time, and 12:00:00, the
        // only time missed and by less than a minute, fires late as scheduled.
        let plan = plan(&t, Misfire::Skip, due, due + 1_200);
        assert_eq!(
            plan.fires,
            vec![
                PlannedFire {
                    at: due,
                    trigger: Trigger::Scheduled,
                    missed: 0
                },
                PlannedFire {
                    at: due + 1_000,
                    trigger: Trigger::Scheduled,
                    missed: 0
                }
            ]
        );
        assert_eq!(plan.next, Some(due + 2_000));
    }

    #[test]
    fn catch_up_is_bounded() {
        let t = Timing::parse("* * * * *", "UTC").unwrap();
        let due = ms("2026-01-10T12:00:00Z");
        // 300 minutes missed: the last 100 fire, the 200 before are one skipped fire.
        let all = plan(&t, Misfire::CatchUp, due, due + 299 * 60_000 + 30_000);
        assert_eq!(all.fires.len(), MAX_CATCH_UP);
        assert_eq!(all.fires[0].at, due + 200 * 60_000);
        assert_eq!(all.skipped, Some((due, 200)));
    }
}
