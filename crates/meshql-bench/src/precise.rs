//! Sleeping to the microsecond inside the runtime, for the open model's schedule.
//!
//! tokio's timer rounds every deadline up to the next millisecond. The open model counts
//! latency from each request's due time, so that millisecond (half of it on average) would be
//! charged to every request, and at the low rates of a latency-vs-load curve it would be most
//! of what is measured. On 64-bit Linux a `timerfd`, armed for the time left, is registered
//! with the runtime's own event loop instead: no extra thread and no cross-thread wake-up, and
//! a busy runtime picks the expiry up on its next poll. Elsewhere, or when no timerfd can be
//! created, tokio's timer is used.

use std::time::Instant;

/// A timer for one task at a time (the open-model runner).
pub struct PreciseTimer {
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    fd: Option<linux::TimerFd>,
}

impl Default for PreciseTimer {
    fn default() -> Self {
        Self::new()
    }
}

impl PreciseTimer {
    /// Must be called within a tokio runtime (the timerfd is registered with its reactor).
    pub fn new() -> Self {
        Self {
            #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
            fd: linux::TimerFd::new().ok(),
        }
    }

    /// Whether sleeps end within microseconds of their deadline (else within a millisecond).
    pub fn is_precise(&self) -> bool {
        #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
        {
            self.fd.is_some()
        }
        #[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
        {
            false
        }
    }

    /// Returns once `deadline` has passed (at once when it already has).
    pub async fn sleep_until(&self, deadline: Instant) {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
            if let Some(fd) = &self.fd {
                if fd.wait(deadline - now).await.is_ok() {
                    continue;
                }
            }
            tokio::time::sleep_until(deadline.into()).await;
        }
    }
}

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod linux {
    use std::fs::File;
    use std::io::{self, Read};
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::time::Duration;
    use tokio::io::unix::AsyncFd;

    /// `struct timespec` on 64-bit Linux.
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }

    /// `struct itimerspec`.
    #[repr(C)]
    struct Itimerspec {
        it_interval: Timespec,
        it_value: Timespec,
    }

    const CLOCK_MONOTONIC: i32 = 1;
    const TFD_NONBLOCK: i32 = 0o4000;
    const TFD_CLOEXEC: i32 = 0o2000000;

    extern "C" {
        fn timerfd_create(clockid: i32, flags: i32) -> i32;
        fn timerfd_settime(
            fd: i32,
            flags: i32,
            new_value: *const Itimerspec,
            old_value: *mut Itimerspec,
        ) -> i32;
    }

    pub struct TimerFd {
        fd: AsyncFd<File>,
    }

    impl TimerFd {
        pub fn new() -> io::Result<Self> {
            // SAFETY: no pointers are passed; a non-negative result is a new descriptor.
            let raw = unsafe { timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC) };
            if raw < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `raw` is an open descriptor nothing else owns; the File closes it.
            let file = unsafe { File::from_raw_fd(raw) };
            // SAFETY: the File owns the descriptor and is only closed when the AsyncFd that
            // owns the File is dropped, so it stays open and the same for the AsyncFd's life.
            let fd = unsafe { AsyncFd::register(file) }?;
            Ok(Self { fd })
        }

        /// Arms the timer to expire `after` from now (one-shot) and waits until it has.
        pub async fn wait(&self, after: Duration) -> io::Result<()> {
            // an all-zero value would disarm the timer
            let after = after.max(Duration::from_nanos(1));
            let spec = Itimerspec {
                it_interval: Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                },
                it_value: Timespec {
                    tv_sec: after.as_secs() as i64,
                    tv_nsec: i64::from(after.subsec_nanos()),
                },
            };
            // SAFETY: `spec` outlives the call and the old value may be null. Re-arming
            // also resets the expiry count, so an expiry left unread from before cannot end
            // this wait early.
            let rc =
                unsafe { timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            loop {
                let mut guard = self.fd.readable().await?;
                let mut count = [0u8; 8];
                match guard.try_io(|f| {
                    let mut file: &File = f.get_ref();
                    file.read(&mut count)
                }) {
                    Ok(result) => return result.map(|_| ()),
                    // readiness left over from an earlier expiry: wait for this one
                    Err(_would_block) => continue,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "current_thread")]
    async fn sleeps_end_after_their_deadline() {
        let timer = PreciseTimer::new();
        #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
        assert!(timer.is_precise());
        for micros in [0u64, 1, 150, 2_500] {
            let deadline = Instant::now() + Duration::from_micros(micros);
            timer.sleep_until(deadline).await;
            assert!(Instant::now() >= deadline, "{micros} µs");
        }
        // a deadline already passed returns at once, and the timer is reusable afterwards
        timer.sleep_until(Instant::now()).await;
        let deadline = Instant::now() + Duration::from_millis(3);
        timer.sleep_until(deadline).await;
        assert!(Instant::now() >= deadline);
    }
}
