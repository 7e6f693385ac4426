//! mp.h's process-wide state: the communicator `mp_init_env` sets up over the TCP bootstrap
//! and `mp_finalize` ends; LibMP's status convention (`MP_SUCCESS`/`MP_FAILURE`, the message
//! in `mp_last_error`); `mp_query_param`, the rank and size.

use crate::args;
use crate::status::{guard, Fail, Res, GDASYNC_ERR_STATE, GDASYNC_OK};
use crate::stream::Stream;
use mp::bootstrap::{JobInfo, TcpBootstrap};
use mp::Comm;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Success.
pub const MP_SUCCESS: c_int = 0;
/// Failure: `mp_last_error()` says why.
pub const MP_FAILURE: c_int = 1;
/// LibMP's API version this library implements (2.0).
pub const MP_API_VERSION: c_int = 2 << 16;
/// `mp_query_param`: the API version.
pub const MP_PARAM_VERSION: c_int = 0;

/// The init flags (bits; LibMP numbered them 1, 2, 3, 4 and tested them as bits).
pub const MP_INIT_KNOWN_FLAGS: c_int = 0xf;

/// The communicator of this process, between `mp_init_env` and `mp_finalize`.
pub(crate) struct MpState {
    pub(crate) comm: Comm,
    /// The GPU of the program's CUDA streams (`None`: -1 was given).
    pub(crate) gpu: Option<i32>,
    /// The streams the stream family was given so far, by the program's stream value, each
    /// wrapped once (kept until `mp_finalize`).
    pub(crate) streams: HashMap<usize, Arc<Stream>>,
}

static STATE: Mutex<Option<MpState>> = Mutex::new(None);
static FINALIZED: AtomicBool = AtomicBool::new(false);

/// Runs an mp.h function's body: MP_SUCCESS, or MP_FAILURE with the message kept for
/// `mp_last_error` (a panic too).
pub(crate) fn mp_guard(what: &str, body: impl FnOnce() -> Res<()>) -> c_int {
    match guard(what, || body().map(|()| GDASYNC_OK)) {
        GDASYNC_OK => MP_SUCCESS,
        _ => MP_FAILURE,
    }
}

/// Runs `f` on the communicator; refused before `mp_init_env` and after `mp_finalize`.
pub(crate) fn with_comm<R>(f: impl FnOnce(&mut Comm) -> Res<R>) -> Res<R> {
    with_state(|s| f(&mut s.comm))
}

/// Runs `f` on the process's mp state; refused before `mp_init_env` and after `mp_finalize`.
pub(crate) fn with_state<R>(f: impl FnOnce(&mut MpState) -> Res<R>) -> Res<R> {
    let mut st = STATE.lock();
    match st.as_mut() {
        Some(s) => f(s),
        None if FINALIZED.load(Ordering::Acquire) => Err(Fail::new(
            GDASYNC_ERR_STATE,
            "mp was finalized (mp_finalize): no mp call may follow it",
        )),
        None => Err(Fail::new(
            GDASYNC_ERR_STATE,
            "mp is not initialised: call mp_init_env (or mp_init) first",
        )),
    }
}

/// Connects this process to the job `info` describes (collective).
fn start(info: &JobInfo, flags: c_int, gpu_id: c_int) -> Res<()> {
    if flags & !MP_INIT_KNOWN_FLAGS != 0 {
        return Err(Fail::invalid(format!(
            "flags {flags:#x} has bits that are no MP_INIT_ flag"
        )));
    }
    if gpu_id < -1 {
        return Err(Fail::invalid(format!(
            "gpu_id {gpu_id}: a GPU ordinal, or -1 for none"
        )));
    }
    let mut st = STATE.lock();
    if st.is_some() {
        return Err(Fail::new(GDASYNC_ERR_STATE, "mp is initialised already"));
    }
    let boot = TcpBootstrap::connect(info, Duration::from_secs(60))?;
    let dev = gdsync::Device::default()?;
    let comm = Comm::new(Box::new(boot), &dev)?;
    *st = Some(MpState {
        comm,
        gpu: (gpu_id >= 0).then_some(gpu_id),
        streams: HashMap::new(),
    });
    FINALIZED.store(false, Ordering::Release);
    Ok(())
}

/// Connects this process to the job's other ranks over the TCP bootstrap, with no MPI: the
/// rank, the size, rank 0's address and the job's secret come from the environment
/// (`GDSYNC_RANK`, `GDSYNC_SIZE`, `GDSYNC_ROOT`, `GDSYNC_JOB_SECRET`; under `mpirun` or
/// `srun` the rank and size come from theirs). Collective: every rank calls it. `flags`:
/// `MP_INIT_*` bits; `gpu_id`: the GPU of the on-stream calls (-1: none).
#[no_mangle]
pub extern "C" fn mp_init_env(flags: c_int, gpu_id: c_int) -> c_int {
    mp_guard("mp_init_env", || {
        start(&JobInfo::from_env()?, flags, gpu_id)
    })
}

/// Room `mp_job_new` needs for a job description, its NUL included.
pub const MP_JOB_MAX: usize = 192;

/// Writes a new job's description into `buf` (`len` bytes, at least `MP_JOB_MAX`): rank 0's
/// address (`GDSYNC_ROOT`, else a free loopback port: one host) and a fresh secret. Rank 0
/// makes it and hands it to every rank (mp.h's `mp_init` does so with `MPI_Bcast`).
#[no_mangle]
pub extern "C" fn mp_job_new(buf: *mut c_char, len: usize) -> c_int {
    mp_guard("mp_job_new", || {
        let root = match std::env::var("GDSYNC_ROOT") {
            Ok(r) => r,
            Err(_) => {
                let l = std::net::TcpListener::bind("127.0.0.1:0")
                    .map_err(|e| gdsync::Error::os("pick a port for rank 0", e))?;
                let port = l
                    .local_addr()
                    .map_err(|e| gdsync::Error::os("pick a port", e))?
                    .port();
                format!("127.0.0.1:{port}")
            }
        };
        let secret = gdsync::auth::JobSecret::generate()?.to_hex();
        args::copy_string(&format!("{root} {secret}"), buf, len, "the job description")
    })
}

/// Connects this process, rank `rank` of `size`, to the job `job` describes (what
/// `mp_job_new` wrote on rank 0). Collective: every rank calls it.
#[no_mangle]
pub extern "C" fn mp_init_job(
    rank: c_int,
    size: c_int,
    job: *const c_char,
    flags: c_int,
    gpu_id: c_int,
) -> c_int {
    mp_guard("mp_init_job", || {
        let (root, secret) = args::string(job, "job")?.split_once(' ').ok_or_else(|| {
            Fail::invalid("job is not what mp_job_new writes (rank 0 could not make it?)")
        })?;
        let (rank, size) = (usize::try_from(rank), usize::try_from(size));
        let (Ok(rank), Ok(size)) = (rank, size) else {
            return Err(Fail::invalid("rank and size must not be negative"));
        };
        if rank >= size {
            return Err(Fail::invalid(format!(
                "rank {rank} out of range for {size} ranks"
            )));
        }
        let secret = secret
            .parse()
            .map_err(|_| Fail::invalid("job's secret is not 64 hex digits"))?;
        start(
            &JobInfo {
                rank,
                size,
                root: root.to_owned(),
                secret,
            },
            flags,
            gpu_id,
        )
    })
}

/// Ends this process's part in the job (collective: waits for every rank to finalize). Its
/// registrations, requests and windows are dead afterwards. LibMP's returns nothing; this
/// one returns MP_FAILURE where a peer failed before the end.
#[no_mangle]
pub extern "C" fn mp_finalize() -> c_int {
    mp_guard("mp_finalize", || {
        let st = STATE.lock().take();
        let Some(st) = st else {
            return with_comm(|_| Ok(()));
        };
        FINALIZED.store(true, Ordering::Release);
        // The streams' lists first: they may still wait for this rank's peers.
        let streams = st.streams.values().try_for_each(|s| s.synchronize());
        st.comm.finalize()?;
        streams?;
        Ok(())
    })
}

/// Stores parameter `param`'s value at `value` (`MP_PARAM_VERSION`: `MP_API_VERSION`).
#[no_mangle]
pub extern "C" fn mp_query_param(param: c_int, value: *mut c_int) -> c_int {
    mp_guard("mp_query_param", || match param {
        MP_PARAM_VERSION => args::write(value, MP_API_VERSION, "value"),
        p => Err(Fail::invalid(format!("param {p} is no MP_PARAM_"))),
    })
}

/// Stores this process's rank and the number of ranks (either pointer may be NULL).
#[no_mangle]
pub extern "C" fn mp_query_rank(rank: *mut c_int, size: *mut c_int) -> c_int {
    mp_guard("mp_query_rank", || {
        let (r, s) = with_comm(|c| Ok((c.rank() as c_int, c.size() as c_int)))?;
        args::write_opt(rank, r, "rank")?;
        args::write_opt(size, s, "size")
    })
}

/// The message of the last mp call that failed on this thread ("" if none has).
#[no_mangle]
pub extern "C" fn mp_last_error() -> *const c_char {
    crate::status::gdasync_last_error()
}
