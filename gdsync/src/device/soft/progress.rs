//! Who runs a soft engine's rounds: its own thread, or the threads that post and poll.
//!
//! A NIC has its own processors; the soft device borrows the host's. With a core to spare,
//! each engine's thread spins on its doorbells, so work no CPU thread of the process posts or
//! polls (doorbells that streams and kernels ring, packets from other processes) is served at
//! once. When the engines and the ranks' polling threads outnumber the cores, spinning engines
//! take turns with the ranks on the scheduler and a round trip costs tens of microseconds.
//! Then the process
//! switches to **shared progress** (logged once at info level): a thread that rings a
//! doorbell or finds nothing to poll runs the engine's rounds itself, as software RDMA
//! providers progress on the caller's thread, and the engine threads nap between short
//! looks (they still serve doorbells that streams, kernels and other processes ring, and
//! the timers).
//!
//! A thread runs the engines of the queues it posts to and polls, not every engine: an
//! engine's state then stays in the cache of the core that uses it, and only the link's
//! ring crosses between ranks, as the wire between two NICs would. The last thread to post
//! to or poll an engine's queues takes it over from the others; a thread that waits for a
//! control command (a modify) helps the engine without taking it.
//!
//! `GDSYNC_SOFT_PROGRESS=thread|shared|auto` chooses; `auto` (the default) shares when
//! `cores < engines + 2` (an engine thread beside two polling ranks). For CPU-driven loops
//! shared progress measured faster than spinning engine threads on free cores
//! (docs/benchmarks.md, "Soft device on few cores"); a value it does not take is an error
//! when a soft device is created ([`crate::env`]).

use super::engine::Engine;
use super::waiting::{Step, Waiting};
use super::watch::Watch;
use super::EngineCtl;
use crate::backoff::Backoff;
use crate::mem::Padded;
use parking_lot::{Mutex, RwLock};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// How this process's soft engines make progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// Each engine's own thread spins on its doorbells and links.
    Thread,
    /// The threads that post and poll run the engines' rounds; engine threads nap.
    Shared,
}

impl std::fmt::Display for ProgressMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProgressMode::Thread => "thread",
            ProgressMode::Shared => "shared",
        })
    }
}

/// The current mode of this process's soft engines.
pub fn progress_mode() -> ProgressMode {
    if SHARED.load(Ordering::Relaxed) {
        ProgressMode::Shared
    } else {
        ProgressMode::Thread
    }
}

/// The mode this process's engines take once `engines` soft devices are open (what
/// `GDSYNC_SOFT_PROGRESS` asks for, or what `auto` chooses on this machine's cores).
pub fn progress_mode_for(engines: usize) -> ProgressMode {
    if decide(engines) {
        ProgressMode::Shared
    } else {
        ProgressMode::Thread
    }
}

fn decide(live: usize) -> bool {
    match setting() {
        Setting::Thread => false,
        Setting::Shared => true,
        Setting::Auto => cores() < live + 2,
    }
}

/// The threads that asked a holder for a round: recorded in test builds only.
#[cfg(test)]
type Askers = Mutex<Vec<std::thread::ThreadId>>;
#[cfg(not(test))]
type Askers = ();

/// An engine and what its thread and its helpers share.
pub(crate) struct EngineCore {
    pub(super) ctl: Arc<EngineCtl>,
    engine: Padded<Mutex<Engine>>,
    /// A round was asked for while another thread held the engine; the holder runs it.
    asked: AtomicBool,
    /// The threads that asked, in test builds (other tests' threads help every engine of the
    /// process, so the flag alone does not say who asked).
    askers: Askers,
    /// The engine thread asks for the timers to run (they then run in the next round).
    timers_asked: AtomicBool,
    /// A helper ran rounds since the engine thread last looked: the ranks drive the engine.
    helped: AtomicBool,
    /// A lent thread's round did something since the engine thread last looked: work is
    /// flowing, so the engine thread keeps its short steps (its own looks may find nothing).
    lent_work: AtomicBool,
    /// A thread that uses the engine's queues ran it since the engine thread last looked.
    /// Other threads leave such an engine alone; an engine nobody owns (its rank only waits
    /// for data to land) is run by whichever threads feed it. (Read by every helper, written
    /// about once a millisecond.)
    owned: Padded<AtomicBool>,
    /// The thread ([`thread_token`]) that last posted to or polled the engine's queues: the
    /// engine is one of that thread's own, and other threads that once used it let it go.
    owner: AtomicU64,
}

/// Whether engines progress on shared threads now.
static SHARED: AtomicBool = AtomicBool::new(false);
/// Engines alive in this process.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// The engines helpers may drive, and a generation that changes with the list.
static ENGINES: RwLock<Vec<Arc<EngineCore>>> = RwLock::new(Vec::new());
static GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's copy of the engine list (refreshed when the generation changes), so a
    /// helper takes no lock that other helpers write.
    static MINE: RefCell<(u64, Vec<Arc<EngineCore>>, usize)> =
        const { RefCell::new((u64::MAX, Vec::new(), 0)) };
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Setting {
    Auto,
    Thread,
    Shared,
}

/// `GDSYNC_SOFT_PROGRESS`'s setting, or the error for a value it does not take.
pub(crate) fn setting_from_env() -> crate::Result<Setting> {
    let v = crate::env::choice("GDSYNC_SOFT_PROGRESS", &["auto", "thread", "shared"])?;
    Ok(match v {
        Some("thread") => Setting::Thread,
        Some("shared") => Setting::Shared,
        _ => Setting::Auto,
    })
}

/// The setting, read once (a soft device is never created under a value it does not take:
/// see `SoftDevice::new`, so the default here is never used for one).
fn setting() -> Setting {
    static S: OnceLock<Setting> = OnceLock::new();
    *S.get_or_init(|| setting_from_env().unwrap_or(Setting::Auto))
}

/// The cores this process may run on (affinity and cgroup quota included).
pub fn cores() -> usize {
    static C: OnceLock<usize> = OnceLock::new();
    *C.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Re-decides the mode after an engine started or stopped; says once when sharing starts.
fn update_mode() {
    let live = LIVE.load(Ordering::Acquire);
    let shared = decide(live);
    let was = SHARED.swap(shared, Ordering::AcqRel);
    if shared {
        // Waiters without a device at hand (executors, the CPU proxy) lend their threads too.
        crate::idle::register(|| help(Why::Poll));
    }
    static SAID: AtomicBool = AtomicBool::new(false);
    if shared && !was && !SAID.swap(true, Ordering::Relaxed) {
        let why = match setting() {
            Setting::Shared => "GDSYNC_SOFT_PROGRESS=shared".to_string(),
            _ => format!(
                "{live} soft engine(s) and the ranks' polling threads outnumber the {} core(s)",
                cores()
            ),
        };
        // Info, not a warning: it is the right choice for the machine, and tools print the
        // mode in their headers.
        tracing::info!(
            "{why}: engines run on the posting and polling threads instead of spinning \
             (for CPU-driven loops the faster mode; doorbells rung by streams and kernels \
             wait for an engine thread's next look, up to about a millisecond)"
        );
    }
}

impl EngineCore {
    pub(super) fn new(ctl: Arc<EngineCtl>, engine: Engine) -> Arc<Self> {
        Arc::new(Self {
            ctl,
            engine: Padded(Mutex::new(engine)),
            asked: AtomicBool::new(false),
            askers: Askers::default(),
            timers_asked: AtomicBool::new(false),
            helped: AtomicBool::new(false),
            lent_work: AtomicBool::new(false),
            owned: Padded(AtomicBool::new(false)),
            owner: AtomicU64::new(0),
        })
    }

    /// Notes the calling thread as one that asked for a round (for tests).
    #[cfg(test)]
    fn record_ask(&self) {
        self.askers.lock().push(std::thread::current().id());
    }

    /// Outside tests nothing is recorded (`askers` is `()`).
    #[cfg(not(test))]
    #[inline(always)]
    fn record_ask(&self) {
        let () = self.askers;
    }

    /// Whether thread `id` handed the holder of the engine a request for a round (for tests).
    #[cfg(test)]
    pub(crate) fn asked_by(&self, id: std::thread::ThreadId) -> bool {
        self.askers.lock().contains(&id)
    }

    /// Holds the engine as a round would (for tests: an engine that cannot run).
    #[cfg(test)]
    pub(crate) fn hold(&self) -> parking_lot::MutexGuard<'_, Engine> {
        self.engine.lock()
    }

    /// Makes the engine visible to helpers and counts it.
    pub(super) fn register(self: &Arc<Self>) {
        let mut all = ENGINES.write();
        all.push(self.clone());
        GENERATION.fetch_add(1, Ordering::AcqRel);
        LIVE.fetch_add(1, Ordering::AcqRel);
        // Under the list's lock: concurrent starts and stops decide in turn.
        update_mode();
        drop(all);
    }

    /// After the engine thread ended: forgets the engine and drops its queues and links
    /// (helpers may still hold the core for a moment).
    pub(super) fn unregister(self: &Arc<Self>) {
        let mut all = ENGINES.write();
        all.retain(|c| !Arc::ptr_eq(c, self));
        GENERATION.fetch_add(1, Ordering::AcqRel);
        LIVE.fetch_sub(1, Ordering::AcqRel);
        // Under the list's lock: concurrent starts and stops decide in turn.
        update_mode();
        drop(all);
        // Blocking: helpers let go at once when they see `stop`, and the links must close
        // now (an in-process peer learns of the loss from their closed flags).
        self.engine.lock().clear();
    }

    /// Runs rounds until one finds nothing to do, or, for a helper, until one did something
    /// (see [`take`](Self::take) for an engine another thread holds). Returns whether
    /// anything happened.
    fn help(&self, who: Who, why: Why) -> bool {
        let mut work = false;
        loop {
            let Some(mut e) = self.take(why) else {
                return work;
            };
            if self.ctl.stop.load(Ordering::Acquire) {
                return work;
            }
            e.clock_may_be_stale();
            // (Atomics are read before they are written: on the ranks' path an idle help
            // costs the lock and one round, not a string of read-modify-writes.)
            if self.asked.load(Ordering::Relaxed) {
                self.asked.store(false, Ordering::SeqCst);
            }
            loop {
                // The timers run when the engine thread asked for them (each time it
                // wakes), whoever holds the engine then; the clock is read only for a
                // round's first timestamp (a read per help would cost the ranks more than
                // an idle round).
                let mut tick = self.timers_asked.load(Ordering::Relaxed)
                    && self.timers_asked.swap(false, Ordering::AcqRel);
                for _ in 0..1024 {
                    // Copies to GPU memory bind a CUDA context to the thread that makes
                    // them: with GPU regions (checked before every round, one may have been
                    // registered meanwhile) only the engine's own thread runs rounds.
                    if who != Who::Engine && e.has_gpu_regions() {
                        self.asked.store(true, Ordering::SeqCst);
                        drop(e);
                        self.ctl.wake();
                        return work;
                    }
                    if who == Who::Helper {
                        set_flag(&self.helped, true);
                    }
                    // A poll waits for what arrives: the links come first in its rounds.
                    let did = if why == Why::Poll {
                        e.poll_round(tick)
                    } else {
                        e.round(tick)
                    };
                    if !did {
                        // Nothing to do: what the round saw is what waiting threads look
                        // at next, instead of running rounds.
                        e.settle_watch();
                        break;
                    }
                    work = true;
                    tick = false;
                    if who == Who::Lender {
                        set_flag(&self.lent_work, true);
                        e.pay_acks_now();
                    }
                    // A helper leaves after a round that did something: the data it
                    // delivered is what its caller polls for, and the caller comes back
                    // (another round here would only delay the caller's next look).
                    if who != Who::Engine {
                        break;
                    }
                }
                if !(self.asked.load(Ordering::SeqCst) && self.asked.swap(false, Ordering::SeqCst))
                {
                    break;
                }
            }
            drop(e);
            // A doorbell whose thread failed to take the lock after our last look is ours.
            if !self.asked.load(Ordering::SeqCst) {
                return work;
            }
        }
    }

    /// Whether a round would find nothing to do, from the engine's [`Watch`] (`copy`, this
    /// thread's, refreshed when the engine replaced it) and the requests for a round; no
    /// lock taken. A thread that looks counts as driving the engine, as a round would.
    #[inline]
    fn quiet(&self, copy: &mut WatchCopy) -> bool {
        let quiet = self.looks_quiet(copy);
        if quiet {
            set_flag(&self.owned, true);
            set_flag(&self.helped, true);
        }
        quiet
    }

    /// [`quiet`](Self::quiet) without counting as driving the engine (a lent thread's look).
    #[inline]
    fn looks_quiet(&self, copy: &mut WatchCopy) -> bool {
        // The watched words first (a packet that came in fails the look soonest); then
        // whether this copy is still the engine's watch (a look at an older one is safe,
        // its memory is kept alive, but says nothing).
        let quiet = copy.watch.as_ref().is_some_and(|w| w.quiet())
            && !self.asked.load(Ordering::Relaxed)
            && !self.timers_asked.load(Ordering::Relaxed)
            && !self.ctl.has_cmds.load(Ordering::Relaxed)
            && self.ctl.watch_gen.load(Ordering::Acquire) == copy.gen;
        if !quiet {
            self.refresh_watch(copy);
        }
        quiet
    }

    /// Takes the engine's current watch if `copy` is older.
    #[cold]
    fn refresh_watch(&self, copy: &mut WatchCopy) {
        let gen = self.ctl.watch_gen.load(Ordering::Acquire);
        if copy.gen != gen {
            copy.watch = Some(self.ctl.watch.lock().clone());
            copy.gen = gen;
        }
    }

    /// [`help`](Self::help) by a thread that uses the engine's queues: marks it owned.
    fn help_as_owner(&self, why: Why) -> bool {
        set_flag(&self.owned, true);
        self.help(Who::Helper, why)
    }

    /// Takes the engine if it is free. A doorbell that finds it held is handed to the
    /// holder (`asked`), which runs the rounds before it lets go; a poll or the engine
    /// thread's look just leaves, as the holder is already driving (and does not touch the
    /// lock's line to find out).
    fn take(&self, why: Why) -> Option<parking_lot::MutexGuard<'_, Engine>> {
        match why {
            Why::Poll | Why::Look if self.engine.is_locked() => None,
            Why::Poll | Why::Look => self.engine.try_lock(),
            Why::Doorbell => self.engine.try_lock().or_else(|| {
                self.asked.store(true, Ordering::SeqCst);
                self.record_ask();
                // The holder may have let go before it could see the request.
                self.engine.try_lock()
            }),
        }
    }
}

/// Stores `v` unless the flag already holds it: flags other threads read are written only
/// when they change, so that their lines stay shared in every reader's cache.
#[inline]
fn set_flag(flag: &AtomicBool, v: bool) {
    if flag.load(Ordering::Relaxed) != v {
        flag.store(v, Ordering::Relaxed);
    }
}

/// Who runs a round: the engine's own thread, a posting or polling thread (which then drives
/// the engine: its thread naps), or a thread lent now and then ([`lend_thread`]: the engine's
/// thread keeps looking on its own).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    Engine,
    Helper,
    Lender,
}

/// Why a thread helps: it rang a doorbell (which must not be left unseen), it polls, or it
/// is the engine's own thread looking for work.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    Doorbell,
    Poll,
    /// The engine thread's look: a full round if the engine is free, else nothing (the
    /// thread holding it runs the rounds, and the engine thread looks again after its
    /// step). It hands nothing to the holder: a holder that keeps the engine (a lent thread
    /// that polls a CQ for an answer) would otherwise be asked again at every look, and the
    /// engine thread, seeing its own request unanswered, would never sleep.
    Look,
}

/// Lends the calling thread to this process's soft engines: when they progress on shared
/// threads ([`ProgressMode::Shared`], on machines with fewer cores than engines and polling
/// ranks), runs the pending rounds of the engines whose queues this thread posted to or
/// polled (of every engine, for a thread that used none yet). Posting and polling do this
/// by themselves; a thread that waits by spinning on memory (as perftest's write latency
/// test does) calls it in its loop. A no-op (one load) otherwise.
#[inline]
pub fn progress() {
    help(Why::Poll);
}

/// What each soft engine of this process is doing, one entry per engine (named by its thread,
/// `gdsync-soft-<device uid>`), for the report of a program that stalled: per QP
/// (`QP <qpn> -> <remote qpn>: ...; `), its link, the send and receive rings as
/// consumed/posted, the WQEs in flight, whether it waits for a retry, the doorbell halves rung
/// and not yet read, and the CQEs written to its CQs; then what is queued on each link. An engine that stays held for 200 ms (a round that does not end) is said to be
/// held instead of waited for. Read without changing anything; empty without soft devices.
pub fn soft_engines_report() -> Vec<String> {
    let engines = ENGINES.read().clone();
    (engines.iter().enumerate())
        .map(|(i, core)| {
            // The engine's thread name (gdsync-soft-<device uid>) says which device it serves.
            let thread = core
                .ctl
                .thread
                .get()
                .and_then(|t| t.name().map(String::from));
            let who = thread.unwrap_or_else(|| format!("soft engine {i}"));
            match core
                .engine
                .try_lock_for(std::time::Duration::from_millis(200))
            {
                Some(e) => format!("{who}: {}", e.state_report()),
                None => format!(
                    "{who}: held by a thread for 200 ms (a round that does not end, or the \
                     caller's own)"
                ),
            }
        })
        .collect()
}

/// Runs the engines' pending rounds on this thread, in shared mode (see [`progress`]).
#[inline]
pub(crate) fn help(why: Why) {
    if SHARED.load(Ordering::Relaxed) {
        help_own_or_all(why);
    }
}

/// Runs one engine's pending rounds on this thread for a control command (a modify, a
/// destroy) that waits to be applied, in shared mode. Unlike [`help_engine`], the engine does
/// not become one of this thread's own: the thread that sets queues up is often not the one
/// that uses them (a launcher connecting every rank's QP), and a thread that took every
/// rank's engine for its own would run them all on each of its polls.
pub(crate) fn help_command(core: &Arc<EngineCore>) {
    if SHARED.load(Ordering::Relaxed) {
        core.help(Who::Helper, Why::Doorbell);
    }
}

/// Runs one engine's pending rounds on this thread, in shared mode: the engine of a queue
/// this thread posted to or polls. The thread then prefers it in [`help`].
#[inline]
pub(crate) fn help_engine(core: &Arc<EngineCore>, why: Why) {
    if SHARED.load(Ordering::Relaxed) {
        adopt(core);
        core.help_as_owner(why);
        help_unowned(why);
    }
}

thread_local! {
    /// The engines of the queues this thread posts to and polls, most recent first. (Held
    /// strongly, to spare every help two reference-count updates: a stopped engine is
    /// dropped from the list when next seen, its core is small once its engine is cleared.)
    static OWN: RefCell<Vec<Own>> = const { RefCell::new(Vec::new()) };
}

/// One of this thread's engines, with this thread's copy of its watch.
struct Own {
    core: Arc<EngineCore>,
    watch: WatchCopy,
}

/// A thread's copy of an engine's [`Watch`] and the generation it was taken at (it keeps the
/// watched memory alive while the thread may look at it).
struct WatchCopy {
    gen: u64,
    watch: Option<Arc<Watch>>,
}

impl WatchCopy {
    /// A copy no look has taken yet (its first look refreshes it).
    const fn unseen() -> Self {
        WatchCopy {
            gen: u64::MAX,
            watch: None,
        }
    }
}

/// How many engines the calling thread holds as its own (for tests).
#[cfg(test)]
pub(crate) fn own_engines() -> usize {
    OWN.with(|o| o.borrow().len())
}

/// Takes `core` for the calling thread's own, as a post or a poll of its queues does (for
/// tests).
#[cfg(test)]
pub(crate) fn take_as_own(core: &Arc<EngineCore>) {
    adopt(core);
}

/// Runs the calling thread's engines as a poll does; then how many it holds as its own (for
/// tests).
#[cfg(test)]
pub(crate) fn own_engines_after_a_poll() -> usize {
    help_own_or_all(Why::Poll);
    own_engines()
}

/// How many engines a thread remembers as its own.
const OWN_MAX: usize = 4;

thread_local! {
    /// This thread's token (nonzero; see [`thread_token`]).
    static TOKEN: u64 = {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

/// A number that names the calling thread among this process's (0 where the thread-local is
/// gone, late in a thread's exit).
#[inline]
fn thread_token() -> u64 {
    TOKEN.try_with(|t| *t).unwrap_or(0)
}

/// Remembers `core` as one of this thread's engines (a comparison when it already is the
/// most recent), and takes it over from the thread that used it before: the thread that set
/// queues up (posting receives ahead for another rank, say) is often not the one that uses
/// them, and it must not go on running an engine another thread now drives. (Should that
/// thread stop using it, the engine counts as nobody's within a nap of its thread, and any
/// thread's [`progress`] runs it again.)
#[inline]
fn adopt(core: &Arc<EngineCore>) {
    let me = thread_token();
    if core.owner.load(Ordering::Relaxed) != me {
        core.owner.store(me, Ordering::Relaxed);
    }
    let _ = OWN.try_with(|o| {
        let Ok(mut o) = o.try_borrow_mut() else {
            return;
        };
        if o.first().is_some_and(|c| Arc::ptr_eq(&c.core, core)) {
            return;
        }
        let at = o.iter().position(|c| Arc::ptr_eq(&c.core, core));
        let mine = match at {
            Some(i) => o.remove(i),
            None => Own {
                core: core.clone(),
                watch: WatchCopy::unseen(),
            },
        };
        o.retain(|c| !c.core.ctl.stop.load(Ordering::Relaxed));
        o.insert(0, mine);
        o.truncate(OWN_MAX);
    });
}

/// Helps this thread's engines, or every engine if it has none (running).
#[cold]
fn help_own_or_all(why: Why) {
    let helped = OWN
        .try_with(|o| {
            let Ok(mut o) = o.try_borrow_mut() else {
                return (true, false); // re-entered from inside a round: the outer call drives
            };
            // A poll that finds every engine still its own and its watch quiet runs no round
            // (the common call of a waiting rank: it comes back to its own look at once).
            let me = thread_token();
            let quiet = |c: &mut Own| {
                c.core.owner.load(Ordering::Relaxed) == me && c.core.quiet(&mut c.watch)
            };
            if why == Why::Poll && !o.is_empty() && o.iter_mut().all(quiet) {
                return (true, false);
            }
            // Engines stopped, or taken over by another thread, are let go.
            let keep = |c: &Own| {
                !c.core.ctl.stop.load(Ordering::Relaxed)
                    && c.core.owner.load(Ordering::Relaxed) == me
            };
            if !o.iter().all(keep) {
                o.retain(keep);
            }
            let mut work = false;
            for c in o.iter() {
                work |= c.core.help_as_owner(why);
            }
            (!o.is_empty(), work)
        })
        .unwrap_or((true, false));
    match helped {
        // The caller's own engine delivered something: the caller looks first (it may be
        // what it waits for); the engines nobody owns are served at its next call (at least
        // every other call, so that a busy engine of the caller's does not starve them).
        (true, true) if !DEFERRED.try_with(|d| d.replace(true)).unwrap_or(true) => {}
        (true, _) => {
            let _ = DEFERRED.try_with(|d| d.set(false));
            help_unowned(why);
        }
        (false, _) => help_all(why),
    }
}

thread_local! {
    /// The last [`help_own_or_all`] left the unowned engines for the next call.
    static DEFERRED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs an engine no thread owns at the moment: a device whose rank only waits for data to
/// land (an RDMA write's target) is progressed by the threads that feed it. One such engine
/// per call, in turn, so that a poll costs a bounded amount of work however many devices
/// the process has.
fn help_unowned(why: Why) {
    let _ = MINE.try_with(|m| {
        let Ok(mut m) = m.try_borrow_mut() else {
            return;
        };
        refresh(&mut m);
        let n = m.1.len();
        // (Counting round from the last one helped, without a division per poll.)
        let mut i = m.2.min(n);
        for _ in 0..n {
            if i == n {
                i = 0;
            }
            let core = &m.1[i];
            i += 1;
            if !core.owned.load(Ordering::Relaxed) {
                core.help(Who::Helper, why);
                m.2 = i;
                return;
            }
        }
    });
}

/// This thread's copy of the engine list, refreshed when the list changed.
fn refresh(m: &mut (u64, Vec<Arc<EngineCore>>, usize)) {
    let gen = GENERATION.load(Ordering::Acquire);
    if m.0 != gen {
        m.1 = ENGINES.read().clone();
        m.0 = gen;
    }
}

/// Lends the calling thread to this process's soft engines for their pending rounds, without
/// taking them over: unlike [`progress`], the engines' own threads keep looking for work as if
/// nobody drove them. For a program whose threads call in only at some of their steps (a verbs
/// program under the emulated HCA lends its threads from `ibv_post_send`, `ibv_post_recv` and
/// an empty `ibv_poll_cq`) and spin on memory between them: the engine must still see what
/// arrives while they spin. A no-op (one load) unless the engines progress on shared threads.
pub fn lend_thread() {
    if !SHARED.load(Ordering::Relaxed) {
        return;
    }
    // Only an engine whose watched words changed is taken: a lent thread that holds an
    // engine with nothing to do, and is preempted there, would keep the engine's own thread
    // from what arrives next for a whole scheduler slice.
    let _ = MINE.try_with(|m| {
        let Ok(mut m) = m.try_borrow_mut() else {
            return; // re-entered from inside a round: the outer call drives
        };
        refresh(&mut m);
        let _ = LENT.try_with(|l| {
            let Ok(mut l) = l.try_borrow_mut() else {
                return;
            };
            if l.0 != m.0 || l.1.len() != m.1.len() {
                l.1 = (0..m.1.len()).map(|_| WatchCopy::unseen()).collect();
                l.0 = m.0;
            }
            for (core, copy) in m.1.iter().zip(l.1.iter_mut()) {
                if !core.looks_quiet(copy) {
                    core.help(Who::Lender, Why::Poll);
                }
            }
        });
    });
}

/// How many RDMA writes without immediate this process's soft engines have taken in as
/// responders, ever: the requests that land without a completion the program could poll for.
/// A caller that lends its thread ([`lend_thread`]) reads it before and after to tell whether
/// a peer's write landed meanwhile (one relaxed load).
pub fn soft_writes_taken_in() -> u64 {
    super::engine::WRITES_TAKEN_IN.load(Ordering::Relaxed)
}

thread_local! {
    /// A lent thread's copies of the engines' watches, in the order of its engine list
    /// (and the list's generation they belong to).
    static LENT: RefCell<(u64, Vec<WatchCopy>)> = const { RefCell::new((u64::MAX, Vec::new())) };
}

#[cold]
fn help_all(why: Why) {
    // (`try_with`: a queue dropped by another thread-local's destructor late in a thread's
    // exit finds this one gone; the engine thread then does the work.)
    let _ = MINE.try_with(|m| {
        let Ok(mut m) = m.try_borrow_mut() else {
            return; // re-entered from inside a round: the outer call drives
        };
        refresh(&mut m);
        // Engines of this process feed each other through in-process links: pass over all
        // of them until a pass finds nothing more to do (bounded; the engine threads and
        // later calls take over from there).
        for _ in 0..8 {
            let mut work = false;
            for core in &m.1 {
                work |= core.help(Who::Helper, why);
            }
            if !work || m.1.len() == 1 {
                break;
            }
        }
    });
}

/// The engine thread: spins on its doorbells and links while the process has cores for it,
/// else runs rounds only when nobody else does and naps in between.
pub(super) fn engine_thread(core: Arc<EngineCore>) {
    core.engine.lock().attach_thread();
    let mut backoff = Backoff::default();
    let mut round = 0u32;
    let mut waiting = Waiting::default();
    while !core.ctl.stop.load(Ordering::Acquire) {
        if SHARED.load(Ordering::Relaxed) {
            shared_step(&core, &mut waiting);
            continue;
        }
        waiting.reset();
        // The coarse clock: every 64 rounds while spinning, every round once the engine
        // yields or sleeps between rounds (a round may then start milliseconds later).
        round = round.wrapping_add(1);
        let tick = round % 64 == 0 || !backoff.spinning();
        let work = core.engine.lock().round(tick);
        if work {
            backoff.reset();
        } else if backoff.would_sleep() {
            nap(&core, &mut backoff);
        } else {
            backoff.snooze_busy();
        }
    }
    core.engine.lock().detach_thread();
}

/// Thread mode's nap: announce it, look once more so a doorbell rung meanwhile is seen,
/// then sleep until a poster's `wake` or the timeout.
fn nap(core: &EngineCore, backoff: &mut Backoff) {
    core.ctl.sleeping.store(true, Ordering::SeqCst);
    let again = core.engine.lock().last_look();
    if again || core.ctl.has_cmds.load(Ordering::Acquire) {
        backoff.reset();
    } else {
        backoff.snooze_parked();
        core.engine.lock().touch_clock();
    }
    core.ctl.sleeping.store(false, Ordering::Relaxed);
}

/// Shared mode: run what is pending (timers included), then leave the cores to the ranks,
/// whose posts and polls run the rounds. An engine nobody drives (the process is a verbs
/// program that knows nothing of gdsync, or its ranks are busy elsewhere) must find
/// doorbells and other processes' packets by looking: it spins briefly after work, then
/// yields, and once a yield kept it off its core for a slice (a thread beside it polls
/// without backing off), sleeps in short steps instead ([`waiting`]).
pub(super) fn shared_step(core: &EngineCore, w: &mut Waiting) {
    let now = Instant::now();
    core.timers_asked.store(true, Ordering::Release);
    // Ranks that drove the engine since the last look run the timers (asked above) and
    // whatever comes next: running rounds here too would only pull the engine's state
    // away from their cores, and work found meanwhile is theirs.
    let driven = core.helped.swap(false, Ordering::Relaxed);
    set_flag(&core.owned, false);
    // If a helper holds the engine, it runs the rounds (timers included: asked above).
    let lent = core.lent_work.load(Ordering::Relaxed);
    if lent {
        core.lent_work.store(false, Ordering::Relaxed);
    }
    let work = !driven && core.help(Who::Engine, Why::Look);
    if lent && !work {
        w.lent_work(now);
    }
    let step = w.next(now, driven, work);
    if step == Step::Spin {
        std::hint::spin_loop();
        return;
    }
    if step == Step::Yield {
        w.sleep(step);
        return;
    }
    core.ctl.sleeping.store(true, Ordering::SeqCst);
    // (A thread that holds the engine now is driving it: no reason to stay awake.)
    let again = !driven && core.engine.try_lock().is_some_and(|mut e| e.last_look());
    // (A doorbell whose thread found the engine busy during the last look is waiting.)
    if !again && !core.ctl.has_cmds.load(Ordering::Acquire) && !core.asked.load(Ordering::SeqCst) {
        w.sleep(step);
    }
    core.ctl.sleeping.store(false, Ordering::Relaxed);
}
