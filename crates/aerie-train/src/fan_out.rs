//! One job per data-parallel replica, in a thread of its own when the replicas are on distinct
//! devices, every thread on the caller's burn stream.
//!
//! Why the stream: burn's fusion and CubeCL key their queues of pending operations on a
//! `StreamId`, which by default is one per thread, and a spawned thread is a new stream. A
//! replica's weights, AdamW state and gradients, made on the trainer's thread, were then read and
//! written from three fresh streams every step (collate, forward and backward, optimizer step),
//! and on burn 0.21 that gives wrong numbers without an error: on two wgpu devices (lavapipe) the
//! replicas' weights drifted apart within 30 steps, while the same two devices driven one after
//! the other from one thread stayed bit for bit equal to one device accumulating both
//! micro-batches (issue 47; burn's multi-thread fusion bugs: tracel-ai/burn#4328). Run on the
//! caller's stream, each device only ever sees one stream, as when the replicas run in turn;
//! two threads sharing a stream id is safe because each touches a different device, and every
//! device keeps its own queues.

use burn::tensor::StreamId;

/// `f` on every job, in order: in one scoped thread per job when `parallel`, else one after the
/// other on this thread. Either way every job runs on this thread's burn stream. A job's panic
/// goes on here, with its own message.
pub(crate) fn per_replica<J: Send, T: Send>(parallel: bool, jobs: Vec<J>, f: impl Fn(J) -> T + Sync) -> Vec<T> {
    if !parallel {
        return jobs.into_iter().map(f).collect();
    }
    let stream = StreamId::current();
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs.into_iter().map(|j| s.spawn(move || stream.executes(|| f(j)))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every job sees the caller's stream, in threads or not, and the results keep job order.
    #[test]
    fn jobs_run_on_the_callers_stream_in_order() {
        let caller = StreamId::current();
        for parallel in [false, true] {
            let seen = per_replica(parallel, vec![0, 1, 2], |j| (j, StreamId::current()));
            assert_eq!(seen, vec![(0, caller), (1, caller), (2, caller)], "parallel = {parallel}");
        }
        // A plain spawned thread is a new stream: what the rule is there to avoid.
        let plain = std::thread::spawn(StreamId::current).join().unwrap();
        assert_ne!(plain, caller);
    }
}
