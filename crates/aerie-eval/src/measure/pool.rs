//! The one request pool of `measure` and `eval serve`: `concurrency` threads taking items in
//! order, the first error stopping the others (after their current item), results back in item
//! order.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::{Error, Result};

/// Run `work(item)` over `items` on `concurrency` threads; `done(n)` after each success with the
/// number done so far. The results in item order, or the first error.
pub fn run_pool<T: Sync, R: Send>(
    items: &[T],
    concurrency: usize,
    work: &(dyn Fn(&T) -> Result<R> + Sync),
    done: &(dyn Fn(usize) + Sync),
) -> Result<Vec<R>> {
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let abort = AtomicBool::new(false);
    let results: Mutex<Vec<(usize, R)>> = Mutex::new(Vec::with_capacity(items.len()));
    let failure: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..concurrency.clamp(1, items.len().max(1)) {
            s.spawn(|| {
                while !abort.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    match work(item) {
                        Ok(r) => {
                            results.lock().expect("no poisoned lock").push((i, r));
                            done(finished.fetch_add(1, Ordering::Relaxed) + 1);
                        }
                        Err(e) => {
                            abort.store(true, Ordering::Relaxed);
                            failure.lock().expect("no poisoned lock").get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().expect("no poisoned lock") {
        return Err(e);
    }
    let mut results = results.into_inner().expect("no poisoned lock");
    results.sort_by_key(|(i, _)| *i);
    Ok(results.into_iter().map(|(_, r)| r).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_in_order_and_the_first_error_stops_the_pool() {
        let items: Vec<u32> = (0..20).collect();
        let got = run_pool(&items, 4, &|&x| Ok(x * 2), &|_| {}).unwrap();
        assert_eq!(got, items.iter().map(|x| x * 2).collect::<Vec<_>>());
        let e =
            run_pool(&items, 3, &|&x| if x == 5 { Err(Error::Incompatible("five".into())) } else { Ok(x) }, &|_| {});
        assert_eq!(e.unwrap_err().to_string(), "five");
    }
}
