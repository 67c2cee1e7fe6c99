//! The results table, printed and written to BENCHMARKS.md with the machine,
//! the date and the command.

use std::fmt::Write as _;

/// How a figure compares with its target.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Miss,
    /// A reference figure or one with no pass/fail target.
    Info,
    /// The scenario could not run; the figure holds the reason.
    NotRun,
}

impl Verdict {
    pub fn of(pass: bool) -> Verdict {
        if pass { Verdict::Pass } else { Verdict::Miss }
    }

    fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Miss => "MISS",
            Verdict::Info => "-",
            Verdict::NotRun => "NOT RUN",
        }
    }
}

/// One line of the table.
pub struct Row {
    pub scenario: String,
    pub figure: String,
    pub target: String,
    pub ratio: String,
    pub verdict: Verdict,
}

impl Row {
    pub fn new(
        scenario: impl Into<String>,
        figure: impl Into<String>,
        target: impl Into<String>,
        ratio: impl Into<String>,
        verdict: Verdict,
    ) -> Row {
        Row {
            scenario: scenario.into(),
            figure: figure.into(),
            target: target.into(),
            ratio: ratio.into(),
            verdict,
        }
    }

    pub fn not_run(scenario: impl Into<String>, why: &str) -> Row {
        Row::new(scenario, why, "", "", Verdict::NotRun)
    }
}

const HEADER: [&str; 5] = ["scenario", "figure", "target", "ratio", "result"];

fn cells(row: &Row) -> [&str; 5] {
    [
        &row.scenario,
        &row.figure,
        &row.target,
        &row.ratio,
        row.verdict.label(),
    ]
}

/// The table as aligned plain text, for the terminal.
pub fn text_table(rows: &[Row]) -> String {
    let mut widths = HEADER.map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(cells(row)) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 5]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i > 0 {
                out.push_str(" | ");
            }
            let pad = w - cell.chars().count();
            out.push_str(cell);
            out.extend(std::iter::repeat_n(' ', pad));
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(HEADER);
    out += &(widths
        .iter()
        .map(|w| "-".repeat(*w))
        .collect::<Vec<_>>()
        .join("-+-")
        + "\n");
    for row in rows {
        out += &line(cells(row));
    }
    out
}

/// The table in Markdown.
pub fn markdown_table(rows: &[Row]) -> String {
    let escape = |s: &str| s.replace('|', "\\|");
    let mut out = format!("| {} |\n|---|---|---|---|---|\n", HEADER.join(" | "));
    for row in rows {
        let cells = cells(row).map(escape);
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out
}

/// What the report says about the machine.
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
}

impl Machine {
    pub fn detect() -> Machine {
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find_map(|l| l.strip_prefix("model name"))
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        Machine { cores, cpu_model }
    }
}

/// The current UTC date and time, "YYYY-MM-DD HH:MM UTC".
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// Everything BENCHMARKS.md holds.
pub struct Document<'a> {
    pub rows: &'a [Row],
    pub notes: &'a [String],
    /// The "Charts" section (Markdown linking the SVGs), or "".
    pub charts: &'a str,
    pub machine: &'a Machine,
    /// /proc/loadavg when the run started: other load makes figures noisy.
    pub load_before: &'a str,
    pub command: &'a str,
    pub date: &'a str,
    pub mode: &'a str,
    pub redis_version: &'a str,
    pub commit: &'a str,
    pub config: &'a str,
    pub method: &'a str,
    /// The section `bench/peer/run` writes (see [`kept_sitting`]).
    pub sitting: &'a str,
}

impl Document<'_> {
    pub fn render(&self) -> String {
        let judged: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| matches!(r.verdict, Verdict::Pass | Verdict::Miss))
            .collect();
        // A row's id: "1b" of "1b. Redis CPU per item, AddMany".
        let id = |r: &&Row| r.scenario.split('.').next().unwrap_or_default().to_string();
        let holding = judged.iter().filter(|r| r.verdict == Verdict::Pass).count();
        let missing: Vec<String> = judged
            .iter()
            .filter(|r| r.verdict == Verdict::Miss)
            .map(id)
            .collect();
        let mut out = String::new();
        let _ = writeln!(out, "# Benchmarks\n");
        out.push_str(&headline(
            self.rows,
            self.sitting,
            self.machine,
            self.command,
            self.commit,
        ));
        let _ = writeln!(
            out,
            "## Every row\n\n\
             Written by `batcher-bench` (`bench/src/`); rerun it to refresh this file. \
             Redis, the service and the load generator share one machine, so the \
             throughputs are figures of this machine and run; the section of \
             `bench/peer/run` below judges the add path against BullMQ and the frozen \
             floors in one sitting. [Benchmarks](docs/benchmarks.md) says what each row \
             means; [bench/sittings/](bench/sittings/README.md) holds every sitting.\n"
        );
        let _ = writeln!(out, "- Command: `{}`", self.command);
        let _ = writeln!(out, "- Mode: {}", self.mode);
        let _ = writeln!(out, "- Date: {}", self.date);
        let _ = writeln!(
            out,
            "- Machine: {} cores, {}",
            self.machine.cores, self.machine.cpu_model
        );
        let _ = writeln!(
            out,
            "- Load average when the run started: {}",
            self.load_before
        );
        let _ = writeln!(out, "- redis-server: {}", self.redis_version);
        let _ = writeln!(out, "- Commit: {}\n", self.commit);
        let _ = writeln!(out, "{}", markdown_table(self.rows));
        let _ = writeln!(
            out,
            "Targets holding: {holding} of {}; missed: {}.\n",
            judged.len(),
            if missing.is_empty() {
                "none".into()
            } else {
                missing.join(", ")
            }
        );
        let _ = writeln!(out, "{}\n", self.sitting.trim_end());
        out.push_str(self.charts);
        if !self.notes.is_empty() {
            let _ = writeln!(out, "## Details\n");
            for note in self.notes {
                let _ = writeln!(out, "- {note}");
            }
            out.push('\n');
        }
        let _ = writeln!(out, "## How each figure is computed\n\n{}", self.method);
        let _ = writeln!(
            out,
            "## Service config under test\n\n```toml\n{}```",
            self.config
        );
        out
    }
}

/// The table BENCHMARKS.md opens with: the headline figures against BullMQ
/// (the medians of the kept `sitting`, see [`Sitting::parse`]), then this
/// run's rows 3, 4 and 6, with the machine and the commands.
fn headline(rows: &[Row], sitting: &str, machine: &Machine, command: &str, commit: &str) -> String {
    let mut out = String::from(
        "| figure | batcher | BullMQ, same sitting | batcher / BullMQ |\n|---|---|---|---|\n",
    );
    let peer = Sitting::parse(sitting);
    if let Some(peer) = &peer {
        let shapes = [
            ("AddMany", "`addBulk` of 100", &peer.add_many),
            ("unary Add", "`add`", &peer.add),
        ];
        for (ours, theirs, m) in shapes {
            let _ = writeln!(
                out,
                "| {ours} (vs {theirs}): items per second | {} | {} | {} |",
                m.rate, m.peer_rate, m.rate_ratio
            );
            let _ = writeln!(
                out,
                "| {ours} (vs {theirs}): Redis CPU per item | {} µs | {} µs | {} |",
                m.us, m.peer_us, m.cost_ratio
            );
        }
    }
    for id in ["4. ", "3. ", "6. "] {
        if let Some(row) = rows.iter().find(|r| r.scenario.starts_with(id)) {
            let name = row.scenario.trim_start_matches(id);
            let _ = writeln!(out, "| {name} | {} | | |", row.figure.replace('|', "\\|"));
        }
    }
    out.push('\n');
    match &peer {
        Some(peer) => {
            let _ = writeln!(
                out,
                "BullMQ {}; the first four rows are the medians over the pairs of {}, \
                 each side on a fresh redis-server, alternating (the sitting's section \
                 below). The other rows are from `{command}` at {commit}.",
                peer.version, peer.run
            );
        }
        None => {
            let _ = writeln!(
                out,
                "No sitting against BullMQ yet: `bench/peer/run` adds its rows. The rows \
                 are from `{command}` at {commit}."
            );
        }
    }
    let _ = writeln!(
        out,
        "Machine: {} cores, {}; Redis, the service and the load share it. \
         Above 1× is faster for a rate, dearer for CPU.\n",
        machine.cores, machine.cpu_model
    );
    out
}

/// One shape's medians in the sitting's table, as it wrote them.
#[derive(Debug, PartialEq)]
struct Medians {
    rate: String,
    us: String,
    peer_rate: String,
    peer_us: String,
    rate_ratio: String,
    cost_ratio: String,
}

/// What the headline takes of the section `bench/peer/run` wrote.
#[derive(Debug, PartialEq)]
struct Sitting {
    /// "`bench/peer/run --pairs 3` at 663ee41, 2026-11-29 08:01 UTC".
    run: String,
    version: String,
    add_many: Medians,
    add: Medians,
}

impl Sitting {
    /// Reads `bench/peer/sitting.mjs`'s section: the line that opens with
    /// the command, and the `| median | AddMany/addBulk |` and
    /// `| median | Add/add |` rows of its table. None when it has none.
    fn parse(section: &str) -> Option<Sitting> {
        let line = section.lines().find(|l| l.starts_with("`bench/peer/run"))?;
        let (run, rest) = line.split_once(", BullMQ ")?;
        let version = rest.split(':').next()?.trim().to_string();
        let medians = |shape: &str| {
            let prefix = format!("| median | {shape} |");
            let row = section.lines().find(|l| l.starts_with(&prefix))?;
            let cells: Vec<&str> = row[prefix.len()..]
                .split('|')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect();
            let [rate, us, peer_rate, peer_us, rate_ratio, cost_ratio] = cells[..] else {
                return None;
            };
            Some(Medians {
                rate: rate.into(),
                us: us.into(),
                peer_rate: peer_rate.into(),
                peer_us: peer_us.into(),
                rate_ratio: rate_ratio.into(),
                cost_ratio: cost_ratio.into(),
            })
        };
        Some(Sitting {
            run: run.to_string(),
            version,
            add_many: medians("AddMany/addBulk")?,
            add: medians("Add/add")?,
        })
    }
}

/// Where the section that `bench/peer/run` writes into BENCHMARKS.md (BullMQ,
/// the frozen floors and the instruction counts, from one sitting) begins
/// and ends. A rerun of the bench rewrites everything else.
const SITTING_START: &str = "<!-- bench/peer/run writes this section; batcher-bench keeps it -->";
const SITTING_END: &str = "<!-- end of bench/peer/run's section -->";

/// The section `bench/peer/run` wrote into the report at `path`, markers
/// included, or a placeholder with the markers when there is none, so the
/// next `bench/peer/run` finds where to write.
pub fn kept_sitting(path: &std::path::Path) -> String {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    if let (Some(start), Some(end)) = (old.find(SITTING_START), old.find(SITTING_END))
        && start < end
    {
        return old[start..end + SITTING_END.len()].to_string();
    }
    format!(
        "{SITTING_START}\n## Against BullMQ and the frozen floors\n\n\
         No sitting yet: `bench/peer/run` writes it here.\n{SITTING_END}"
    )
}

/// The load average (1, 5, 15 min) from /proc/loadavg, or "unknown".
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The command that reproduces this run.
pub fn command_line() -> String {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .map(|a| {
            if a.contains(|c: char| c.is_whitespace() || "'\"$`\\".contains(c)) {
                format!("'{}'", a.replace('\'', "'\\''"))
            } else {
                a
            }
        })
        .collect();
    if args.is_empty() {
        "cargo run --release --bin batcher-bench".into()
    } else {
        format!(
            "cargo run --release --bin batcher-bench -- {}",
            args.join(" ")
        )
    }
}

/// `git describe --always --dirty` of the repository, or "unknown".
pub fn git_commit() -> String {
    std::process::Command::new("git")
        .arg("-C")
        .arg(super::repo_root())
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// What a run has found so far: the table's rows and notes, the charts'
/// data, and whether any scenario could not run.
pub struct Results {
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    pub failed: bool,
    /// What the charts are drawn from, filled in as the scenarios report.
    pub charts: super::charts::Data,
    /// Scenario ids given to --only; empty for all.
    only: Vec<String>,
}

impl Results {
    pub fn new(only: Vec<String>) -> Results {
        Results {
            rows: Vec::new(),
            notes: Vec::new(),
            failed: false,
            charts: super::charts::Data::default(),
            only,
        }
    }

    pub fn wants(&self, id: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == id)
    }

    /// Records a scenario that could not run, as a NOT RUN row.
    pub fn not_run(&mut self, name: &str, error: &str) {
        eprintln!("batcher-bench: {name} could not run: {error}");
        self.failed = true;
        self.rows.push(Row::not_run(name, error));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The headline reads the medians of the section sitting.mjs writes.
    #[test]
    fn the_headline_reads_the_sitting_medians() {
        let section = "## Against BullMQ\n\n\
            `bench/peer/run --pairs 3` at 663ee41, 2026-11-29 08:01 UTC, BullMQ 6.7.0: batcher's ...\n\n\
            | pair | shape | a | b | c | d | e | f |\n|---|---|---|---|---|---|---|---|\n\
            | median | AddMany/addBulk | 112370 | 8.8 | 55440 | 14.3 | 2.02× | 0.61× |\n\
            | median | Add/add | 30817 | 13.4 | 61753 | 15.1 | 0.50× | 0.89× |\n";
        let sitting = Sitting::parse(section).expect("a sitting");
        assert_eq!(
            sitting.run,
            "`bench/peer/run --pairs 3` at 663ee41, 2026-11-29 08:01 UTC"
        );
        assert_eq!(sitting.version, "6.7.0");
        assert_eq!(sitting.add_many.rate, "112370");
        assert_eq!(sitting.add.cost_ratio, "0.89×");
        assert!(Sitting::parse(&kept_sitting(std::path::Path::new("/nonexistent"))).is_none());
    }

    /// A rerun of the bench keeps the section bench/peer/run wrote, and a
    /// report without one gets the markers for the next sitting.
    #[test]
    fn the_sitting_section_survives_a_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("BENCHMARKS.md");
        let fresh = kept_sitting(&path);
        assert!(fresh.starts_with(SITTING_START) && fresh.ends_with(SITTING_END));
        let section = format!("{SITTING_START}\n## Against BullMQ\n\n| a | b |\n{SITTING_END}");
        std::fs::write(
            &path,
            format!("# Benchmarks\n\nold rows\n\n{section}\n\n## Charts\n"),
        )
        .unwrap();
        assert_eq!(kept_sitting(&path), section);
    }
}
