//! `batcher-bench service-instructions`: the service's own instructions
//! per unary Add, counted by callgrind, beside the frozen service floor's
//! (`floor_serve.rs`). Row 2b's service CPU per add moves with the
//! machine's speed. This count does not, so it shows what our code costs
//! beyond the stack, even on a noisy machine.
//!
//! Each service runs under `valgrind --tool=callgrind` on a fresh
//! redis-server of its own: ours is `__serve` with the bench's config, the
//! floor is `__floor_serve`. One caller on one connection sends [`WARMUP`]
//! adds. Then callgrind's counts are dumped, which zeroes them. Then the
//! caller sends `adds` more, one at a time, each awaited, and a second
//! dump gives the count over every thread of the service; divided by
//! `adds`, that is the figure. Keys are drawn by a seeded xorshift over
//! `adds / 10` keys, so groups fill to the bench's `max_items` of 10 and
//! flush, as under scenario 2. Ids are unique, so every add is added. With
//! one caller nothing is merged: each add is a call of its own, as at row
//! 12's one caller.
//!
//! What the count leaves out:
//! - the kernel's part, such as the sockets' system calls, since callgrind
//!   counts user space only; ours makes fewer of them than the floor
//!   (`bench/sittings/40-ea494c0-machine-cpu.md`);
//! - Redis.
//!
//! What runs on a timer in the service, such as the sweeper's wake-ups, is
//! counted for as long as the window lasts, and callgrind stretches the
//! window some fifty times. So repeated counts differ a little.

use std::time::Duration;

use batcher::pb;
use batcher_testkit::wait::Wait;

use crate::instructions::{check_tools, dump_counts};
use crate::load::{self, Client, Rng};
use crate::procs::{self, ServiceProc};
use crate::service::{self, SHARDS};

/// Adds sent before the count starts: connections made, scripts loaded,
/// the first groups opened.
const WARMUP: u64 = 200;
/// Adds counted unless `--adds` says otherwise.
pub const ADDS: u64 = 3000;
/// The seed of the keys' draw.
const SEED: u64 = 26;
/// How long a service under callgrind may take to answer its first add.
const FIRST_ADD: Duration = Duration::from_secs(120);

/// The options of `batcher-bench service-instructions`.
#[derive(clap::Args)]
pub struct Opts {
    /// Adds counted for each service.
    #[arg(long, default_value_t = ADDS)]
    adds: u64,
}

/// Counts ours and the floor's instructions per unary add, and prints them
/// with their ratio.
pub async fn run(opts: Opts) -> Result<(), String> {
    check_tools()?;
    let adds = opts.adds.max(10);
    let ours = count(adds, |url| {
        // Two threads, as the floor's runtime has here, so that the two
        // counts and those of earlier commits compare.
        let config = service::service_config(url, SHARDS, Some(2));
        vec!["__serve".into(), "--config-toml".into(), config]
    })
    .await?;
    let floor = count(adds, |url| {
        vec!["__floor_serve".into(), "--redis-url".into(), url.into()]
    })
    .await?;
    println!(
        "service instructions per unary add, one caller, {adds} adds (callgrind, every thread):"
    );
    println!("  batcher            {ours:>9.0}");
    println!("  the service floor  {floor:>9.0}");
    println!("  batcher / floor    {:>9.2}x", ours / floor);
    Ok(())
}

/// Runs the service that `args` (given Redis's URL) starts under callgrind
/// and returns its instructions per add over `adds` adds.
async fn count(adds: u64, args: impl Fn(&str) -> Vec<String>) -> Result<f64, String> {
    let redis = procs::start_redis()?;
    let dir = tempfile::Builder::new()
        .prefix("batcher-service-instructions-")
        .tempdir()
        .map_err(|e| format!("a temporary directory: {e}"))?;
    let out = dir.path().join("callgrind.out");
    let vgdb = dir.path().join("vgdb-pipe");
    let valgrind = [
        "--tool=callgrind".to_string(),
        format!("--vgdb-prefix={}", vgdb.display()),
        format!("--callgrind-out-file={}", out.display()),
    ];
    let args = args(&redis.url());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let service = ServiceProc::start_under_valgrind(&valgrind, &args).await?;
    let mut client = Wait::new(
        "the service under callgrind to accept a connection",
        FIRST_ADD,
    )
    .every(Duration::from_millis(200))
    .until_ok(|| load::connect(service.addr))
    .await
    .map_err(|e| e.to_string())?;
    let mut caller = Caller {
        rng: Rng::new(SEED),
        keys: (adds / 10).max(1),
        sent: 0,
    };
    // The first add waits until the service reaches Redis.
    Wait::new("the service under callgrind to answer an add", FIRST_ADD)
        .every(Duration::from_millis(200))
        .until_ok(|| {
            let request = caller.request();
            let mut client = client.clone();
            async move {
                client
                    .add(request)
                    .await
                    .map_err(|s| s.message().to_string())
            }
        })
        .await
        .map_err(|e| e.to_string())?;
    for _ in 1..WARMUP {
        caller.add(&mut client).await?;
    }
    dump_counts(service.pid(), &vgdb, &out, 1).await?;
    for _ in 0..adds {
        caller.add(&mut client).await?;
    }
    let instructions = dump_counts(service.pid(), &vgdb, &out, 2).await?;
    Ok(instructions as f64 / adds as f64)
}

/// The one caller: its keys' draw and how many ids it has used.
struct Caller {
    rng: Rng,
    keys: u64,
    sent: u64,
}

impl Caller {
    /// The next add: a drawn key, a new id, the standard payload.
    fn request(&mut self) -> pb::AddRequest {
        self.sent += 1;
        let key = load::key("si", "0", self.rng.below(self.keys));
        load::add_request(key, load::id("0", 0, self.sent))
    }

    /// Sends the next add, and fails unless it was added.
    async fn add(&mut self, client: &mut Client) -> Result<(), String> {
        let response = client
            .add(self.request())
            .await
            .map_err(|s| format!("Add: {}", s.message()))?
            .into_inner();
        if response.outcome != pb::AddOutcome::Added as i32 {
            return Err(format!("add {} was not added: {response:?}", self.sent));
        }
        Ok(())
    }
}
