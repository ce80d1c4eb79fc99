//! Script transforms (`type = "script"`): a JavaScript function per input change, run by an
//! embedded QuickJS (`rquickjs`).
//!
//! ```js
//! // the file defines transform(change) and returns a document, a list of them, or nothing
//! function transform(change) {   // {entity, id, op, change_id, created_at, correlation_id, payload}
//!   if (change.op === "delete") return null;
//!   return { order_id: change.id, total: change.payload.qty * change.payload.price };
//! }
//! ```
//!
//! A returned document may carry `id` (its id) and `_delete: true` (delete that id);
//! documents without `id` get one derived from the change (see [`crate::transform`]).
//!
//! **Why QuickJS.** JavaScript is the language MeshQL's users write (its services are
//! TypeScript and Java), JSON is native to it, and QuickJS is a small interpreter with no I/O
//! of its own: a script sees its argument and the language, no files, network or clock
//! beyond `Date`. `rquickjs` is the maintained binding. (Rhai, the usual pure-Rust choice, is
//! already in this binary through casbin with `unchecked` and `no_float` — features Cargo would
//! unify into ours, removing the operation limits and floating point we need.)
//!
//! **Bounds.** Each script has its own runtime with a memory limit (`memory_bytes`, default
//! 16 MiB) and a time limit per change (`timeout_ms`, default 100): an interrupt handler ends a
//! call that runs past it. A change whose call fails, throws, runs out of time or memory, or
//! returns something that is not an object goes to the dead letters with the reason; the
//! script is loaded again after a failure that may have left it in a bad state.

use crate::plan::Input;
use crate::transform::{Emit, Transform};
use parking_lot::Mutex;
use rquickjs::{Context, Ctx, Function, Runtime};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one call may use.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub timeout: Duration,
    pub memory_bytes: usize,
}

struct Engine {
    _runtime: Runtime,
    context: Context,
}

/// One engine and the clock of its call in progress.
struct Slot {
    engine: Mutex<Engine>,
    /// Deadline of the call in progress (ms since `epoch`); 0 when idle.
    deadline: Arc<AtomicI64>,
    interrupted: Arc<AtomicBool>,
}

/// A loaded script: one engine per lane that may call it at once (`parallel`), each with its
/// own memory and time limits.
pub struct Script {
    name: String,
    source: String,
    limits: Limits,
    slots: Vec<Slot>,
    /// Where a caller that finds every engine busy waits next.
    next: AtomicUsize,
    epoch: Instant,
}

fn describe(ctx: &Ctx<'_>, e: rquickjs::Error) -> String {
    if e.is_exception() {
        let thrown = ctx.catch();
        if let Some(ex) = thrown
            .as_object()
            .and_then(|o| rquickjs::Exception::from_object(o.clone()))
        {
            return ex.message().unwrap_or_else(|| "an exception".into());
        }
        if thrown.is_null() || thrown.is_undefined() {
            // QuickJS cannot allocate an error object once the memory limit is reached
            return "failed without an error object: out of its memory limit (or `throw null`)"
                .into();
        }
        return match ctx.json_stringify(thrown) {
            Ok(Some(s)) => format!("threw {}", s.to_string().unwrap_or_default()),
            _ => "threw a value".into(),
        };
    }
    e.to_string()
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Script").field("name", &self.name).finish()
    }
}

impl Script {
    /// Loads `source` (named `name` in messages) into `engines` engines (at least one); fails
    /// when it does not parse or defines no `transform` function.
    pub fn new(name: &str, source: &str, limits: Limits, engines: usize) -> Result<Script, String> {
        let epoch = Instant::now();
        let mut slots = Vec::with_capacity(engines.max(1));
        for _ in 0..engines.max(1) {
            let deadline = Arc::new(AtomicI64::new(0));
            let interrupted = Arc::new(AtomicBool::new(false));
            let engine = Self::load(name, source, limits, &deadline, &interrupted, epoch)?;
            slots.push(Slot {
                engine: Mutex::new(engine),
                deadline,
                interrupted,
            });
        }
        Ok(Script {
            name: name.to_owned(),
            source: source.to_owned(),
            limits,
            slots,
            next: AtomicUsize::new(0),
            epoch,
        })
    }

    /// A free engine, or (all busy) the next one in turn once it is free.
    fn slot(&self) -> (&Slot, parking_lot::MutexGuard<'_, Engine>) {
        for slot in &self.slots {
            if let Some(engine) = slot.engine.try_lock() {
                return (slot, engine);
            }
        }
        let slot = &self.slots[self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len()];
        (slot, slot.engine.lock())
    }

    fn load(
        name: &str,
        source: &str,
        limits: Limits,
        deadline: &Arc<AtomicI64>,
        interrupted: &Arc<AtomicBool>,
        epoch: Instant,
    ) -> Result<Engine, String> {
        let runtime = Runtime::new().map_err(|e| format!("{name}: {e}"))?;
        runtime.set_memory_limit(limits.memory_bytes);
        runtime.set_max_stack_size(256 * 1024);
        let (deadline, flag) = (deadline.clone(), interrupted.clone());
        runtime.set_interrupt_handler(Some(Box::new(move || {
            let d = deadline.load(Ordering::Relaxed);
            let over = d != 0 && epoch.elapsed().as_millis() as i64 > d;
            if over {
                flag.store(true, Ordering::Relaxed);
            }
            over
        })));
        let context = Context::full(&runtime).map_err(|e| format!("{name}: {e}"))?;
        context.with(|ctx| -> Result<(), String> {
            ctx.eval::<(), _>(source)
                .map_err(|e| format!("{name}: {}", describe(&ctx, e)))?;
            ctx.globals()
                .get::<_, Function>("transform")
                .map_err(|_| format!("{name}: defines no `function transform(change)`"))?;
            Ok(())
        })?;
        Ok(Engine {
            _runtime: runtime,
            context,
        })
    }

    fn call(&self, engine: &Engine, argument: &str) -> Result<String, String> {
        engine.context.with(|ctx| {
            let f: Function = ctx
                .globals()
                .get("transform")
                .map_err(|e| describe(&ctx, e))?;
            let arg = ctx.json_parse(argument).map_err(|e| describe(&ctx, e))?;
            let result: rquickjs::Value = f.call((arg,)).map_err(|e| describe(&ctx, e))?;
            if result.is_undefined() || result.is_null() {
                return Ok("null".to_owned());
            }
            match ctx.json_stringify(result).map_err(|e| describe(&ctx, e))? {
                Some(s) => s.to_string().map_err(|e| e.to_string()),
                None => Ok("null".to_owned()),
            }
        })
    }
}

impl Transform for Script {
    fn transform(&self, input: &Input) -> Result<Vec<Emit>, String> {
        let argument = serde_json::json!({
            "entity": input.entity,
            "id": input.id,
            "op": input.op.as_str(),
            "change_id": input.change_id,
            "created_at": input.created_at,
            "correlation_id": input.correlation_id,
            "payload": input.payload,
        })
        .to_string();
        let (slot, mut engine) = self.slot();
        slot.interrupted.store(false, Ordering::Relaxed);
        let limit =
            self.epoch.elapsed().as_millis() as i64 + self.limits.timeout.as_millis() as i64;
        slot.deadline.store(limit, Ordering::Relaxed);
        let result = self.call(&engine, &argument);
        slot.deadline.store(0, Ordering::Relaxed);
        let text = match result {
            Ok(t) => t,
            Err(e) => {
                let timed_out = slot.interrupted.load(Ordering::Relaxed);
                // a call cut short may leave the script's globals half-changed: start afresh
                if let Ok(fresh) = Self::load(
                    &self.name,
                    &self.source,
                    self.limits,
                    &slot.deadline,
                    &slot.interrupted,
                    self.epoch,
                ) {
                    *engine = fresh;
                }
                return Err(if timed_out {
                    format!(
                        "{}: the script ran longer than {} ms",
                        self.name,
                        self.limits.timeout.as_millis()
                    )
                } else {
                    format!("{}: {e}", self.name)
                });
            }
        };
        drop(engine);
        let value: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let docs = match value {
            Value::Null => Vec::new(),
            Value::Array(items) => items,
            other => vec![other],
        };
        docs.into_iter()
            .map(|d| match d {
                Value::Object(mut m) => {
                    let id = match m.remove("id") {
                        Some(Value::String(s)) => Some(s),
                        Some(Value::Null) | None => None,
                        Some(other) => Some(other.to_string()),
                    };
                    let delete = matches!(m.remove("_delete"), Some(Value::Bool(true)));
                    if delete {
                        let Some(id) = id else {
                            return Err(format!(
                                "{}: `_delete: true` needs the `id` to delete",
                                self.name
                            ));
                        };
                        return Ok(Emit {
                            id: Some(id),
                            payload: None,
                        });
                    }
                    Ok(Emit {
                        id,
                        payload: Some(m),
                    })
                }
                other => Err(format!(
                    "{}: transform returned {other}, not an object",
                    self.name
                )),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshql_core::ChangeOp;
    use serde_json::json;

    fn limits() -> Limits {
        Limits {
            timeout: Duration::from_millis(100),
            memory_bytes: 8 << 20,
        }
    }

    fn change(payload: Value) -> Input {
        Input {
            position: 1,
            change_id: "order:o1:9".into(),
            entity: "order".into(),
            id: "o1".into(),
            op: ChangeOp::Create,
            created_at: 9,
            correlation_id: Some("c".into()),
            payload: payload.as_object().unwrap().clone(),
            order: (0, 1),
            fresh: false,
        }
    }

    #[test]
    fn a_script_maps_a_change_to_documents() {
        let s = Script::new(
            "t.js",
            "function transform(c) { if (c.payload.qty === 0) return null;
               return [{ order_id: c.id, total: c.payload.qty * c.payload.price, op: c.op },
                       { id: 'fixed', _delete: true }]; }",
            limits(),
            1,
        )
        .unwrap();
        let out = s
            .transform(&change(json!({"qty": 3, "price": 2.5})))
            .unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[0].payload.as_ref().unwrap(),
            json!({"order_id": "o1", "total": 7.5, "op": "create"})
                .as_object()
                .unwrap()
        );
        assert_eq!(out[0].id, None);
        assert_eq!(
            (out[1].id.as_deref(), out[1].payload.is_none()),
            (Some("fixed"), true)
        );
        assert!(s.transform(&change(json!({"qty": 0}))).unwrap().is_empty());
    }

    #[test]
    fn scripts_are_bounded_in_time_and_memory_and_errors_are_reasons() {
        let s = Script::new(
            "loop.js",
            "var calls = 0; function transform(c) { calls++; if (c.payload.spin) { while (true) {} }
               if (c.payload.grow) { var a = []; while (true) { a.push(new Array(1000).fill('x')); } }
               if (c.payload.fail) throw new Error('no price'); return { calls: calls }; }",
            limits(),
            1,
        )
        .unwrap();
        let started = Instant::now();
        let e = s.transform(&change(json!({"spin": true}))).unwrap_err();
        assert!(e.contains("longer than 100 ms"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let e = s.transform(&change(json!({"grow": true}))).unwrap_err();
        assert!(e.contains("memory") || e.contains("out of"), "{e}");
        let e = s.transform(&change(json!({"fail": true}))).unwrap_err();
        assert!(e.contains("no price"), "{e}");
        // after a failure the script starts afresh and still works
        let ok = s.transform(&change(json!({}))).unwrap();
        assert_eq!(ok[0].payload.as_ref().unwrap()["calls"], 1);
        let e = Script::new("bad.js", "function nope( {", limits(), 1).unwrap_err();
        assert!(e.starts_with("bad.js:"), "{e}");
        let e = Script::new("none.js", "var x = 1;", limits(), 1).unwrap_err();
        assert!(e.contains("defines no"), "{e}");
        let s = Script::new("n.js", "function transform(c) { return 3; }", limits(), 1).unwrap();
        assert!(s
            .transform(&change(json!({})))
            .unwrap_err()
            .contains("not an object"));
    }

    #[test]
    fn engines_run_at_once_each_with_its_own_time_limit() {
        let s = Arc::new(
            Script::new(
                "two.js",
                "function transform(c) { var t = Date.now() + c.payload.ms;
                   while (Date.now() < t) {} return { ms: c.payload.ms }; }",
                limits(),
                2,
            )
            .unwrap(),
        );
        // one call runs past its limit while the other, started later, finishes in time:
        // the first's deadline does not cut the second short, nor the reverse
        let slow = {
            let s = s.clone();
            std::thread::spawn(move || s.transform(&change(json!({"ms": 400}))))
        };
        std::thread::sleep(Duration::from_millis(20));
        let quick = s.transform(&change(json!({"ms": 60}))).unwrap();
        assert_eq!(quick[0].payload.as_ref().unwrap()["ms"], 60);
        let e = slow.join().unwrap().unwrap_err();
        assert!(e.contains("longer than 100 ms"), "{e}");
        // both engines still answer
        for _ in 0..2 {
            assert!(s.transform(&change(json!({"ms": 0}))).is_ok());
        }
    }
}
