//! A lock taken in turns by peers: one holder at a time (the bcrypt
//! checks of basic authentication, as exporter-toolkit runs them), and the
//! waiters queued per peer, the peers with waiters served round-robin. A
//! peer with many requests waiting delays another peer's first by at most
//! one turn per peer waiting, not by its whole queue: a flood of wrong
//! passwords from a few addresses cannot make a right password from
//! another wait for all of them.
//!
//! The queue holds at most one waiter per request in a handler, so it is
//! as bounded as the connections are (`--web.max-connections`, HTTP/1
//! serves one request of a connection at a time); a waiter whose request
//! goes (its connection closed) leaves it at once.

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;

/// Who holds the turn and who waits, in the order they will get it
/// (pure: `T` is what wakes a waiter).
struct Queue<T> {
    held: bool,
    /// Peers with waiters, the next to be served first.
    order: VecDeque<IpAddr>,
    /// Each peer's waiters, oldest first, with their ids.
    waiting: BTreeMap<IpAddr, VecDeque<(u64, T)>>,
    next: u64,
}

impl<T> Queue<T> {
    const fn new() -> Queue<T> {
        Queue { held: false, order: VecDeque::new(), waiting: BTreeMap::new(), next: 0 }
    }

    /// A request from `peer` asks for the turn: `Ok` when it takes it now
    /// (nobody holds it), else `Err` with its place in the queue (`t`
    /// will be handed the turn).
    fn arrive(&mut self, peer: IpAddr, t: T) -> Result<(), u64> {
        if !self.held {
            self.held = true;
            return Ok(());
        }
        let id = self.next;
        self.next += 1;
        let queue = self.waiting.entry(peer).or_default();
        if queue.is_empty() {
            self.order.push_back(peer);
        }
        queue.push_back((id, t));
        Err(id)
    }

    /// Waiter `id` of `peer` gives up its place; false when it has none
    /// (the turn was handed to it).
    fn leave(&mut self, peer: IpAddr, id: u64) -> bool {
        let Some(queue) = self.waiting.get_mut(&peer) else { return false };
        let Some(i) = queue.iter().position(|(w, _)| *w == id) else { return false };
        queue.remove(i);
        if queue.is_empty() {
            self.waiting.remove(&peer);
            self.order.retain(|p| *p != peer);
        }
        true
    }

    /// The holder is done: the next waiter (the oldest of the next peer in
    /// turn), which now holds the turn, or `None` when nobody waits (the
    /// turn is free).
    fn pass(&mut self) -> Option<T> {
        while let Some(peer) = self.order.pop_front() {
            let Some(queue) = self.waiting.get_mut(&peer) else { continue };
            let Some((_, t)) = queue.pop_front() else {
                self.waiting.remove(&peer);
                continue;
            };
            if queue.is_empty() {
                self.waiting.remove(&peer);
            } else {
                self.order.push_back(peer);
            }
            return Some(t);
        }
        self.held = false;
        None
    }
}

/// One holder at a time, peers in turn (see the module's header).
pub struct Turns {
    queue: Mutex<Queue<tokio::sync::oneshot::Sender<()>>>,
}

/// The turn, held until dropped (then handed to the next waiter).
pub struct Turn<'a>(&'a Turns);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.pass();
    }
}

/// A place in the queue; leaving it (the request went before its turn)
/// removes it, or, when the turn was handed to it meanwhile, passes the
/// turn on.
struct Place<'a> {
    turns: &'a Turns,
    peer: IpAddr,
    id: u64,
    woken: tokio::sync::oneshot::Receiver<()>,
    served: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.served {
            return;
        }
        let left = self.turns.lock().leave(self.peer, self.id);
        if !left {
            self.turns.pass();
        }
    }
}

impl Default for Turns {
    fn default() -> Self {
        Turns::new()
    }
}

impl Turns {
    pub const fn new() -> Turns {
        Turns { queue: Mutex::new(Queue::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue<tokio::sync::oneshot::Sender<()>>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands the turn to the next waiter, or frees it. A waiter is handed
    /// the turn under the lock, so it either still has its place or has
    /// been handed the turn, never both.
    fn pass(&self) {
        let mut q = self.lock();
        while let Some(next) = q.pass() {
            if next.send(()).is_ok() {
                return;
            }
        }
    }

    /// Waits for the turn of a request from `peer` (an address, or an
    /// IPv6 /64: `admission::peer_key`).
    pub async fn take(&self, peer: IpAddr) -> Turn<'_> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let id = match self.lock().arrive(peer, tx) {
            Ok(()) => return Turn(self),
            Err(id) => id,
        };
        let mut place = Place { turns: self, peer, id, woken: rx, served: false };
        // The sender is dropped unsent only by `leave`, which this place
        // alone calls: the wait ends with the turn handed to it.
        let _ = (&mut place.woken).await;
        place.served = true;
        Turn(self)
    }

    /// Requests waiting for the turn.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock().waiting.values().map(VecDeque::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn peers_are_served_in_turn_each_in_order() {
        let (a, b, c) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"));
        let mut q = Queue::new();
        assert_eq!(q.arrive(a, "a0"), Ok(()), "free: taken at once");
        // a floods; b and c arrive later with one each.
        for t in ["a1", "a2", "a3", "a4"] {
            assert!(q.arrive(a, t).is_err());
        }
        assert!(q.arrive(b, "b1").is_err());
        assert!(q.arrive(c, "c1").is_err());
        assert!(q.arrive(b, "b2").is_err());
        let mut served = Vec::new();
        while let Some(t) = q.pass() {
            served.push(t);
        }
        assert_eq!(served, ["a1", "b1", "c1", "a2", "b2", "a3", "a4"]);
        assert!(!q.held, "free once nobody waits");
        assert_eq!(q.arrive(c, "c2"), Ok(()));
    }

    #[test]
    fn a_waiter_that_leaves_loses_only_its_place() {
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        let mut q = Queue::new();
        assert_eq!(q.arrive(a, 0), Ok(()));
        let a1 = q.arrive(a, 1).unwrap_err();
        let b1 = q.arrive(b, 2).unwrap_err();
        let a2 = q.arrive(a, 3).unwrap_err();
        assert!(q.leave(b, b1), "b's only waiter leaves: b is out of the rotation");
        assert!(!q.leave(b, b1), "not twice");
        assert_eq!(q.pass(), Some(1));
        assert!(!q.leave(a, a1), "handed the turn: no place left");
        assert!(q.leave(a, a2));
        assert_eq!(q.pass(), None);
        assert!(q.order.is_empty() && q.waiting.is_empty());
    }

    /// One holder at a time; the turn goes round the peers; a waiter
    /// dropped before its turn (its connection closed) neither keeps nor
    /// loses the turn for the others, even when it was handed the turn
    /// just before it went.
    #[tokio::test(flavor = "current_thread")]
    async fn turns_are_exclusive_and_survive_waiters_that_go() {
        static TURNS: Turns = Turns::new();
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        let first = TURNS.take(a).await;
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let spawn = |peer, name: &'static str| {
            let order = std::sync::Arc::clone(&order);
            tokio::spawn(async move {
                let _t = TURNS.take(peer).await;
                order.lock().unwrap().push(name);
                tokio::time::sleep(Duration::from_millis(5)).await;
            })
        };
        let a1 = spawn(a, "a1");
        let a2 = spawn(a, "a2");
        let gone = spawn(a, "gone");
        let b1 = spawn(b, "b1");
        tokio::task::yield_now().await;
        assert_eq!(TURNS.waiting(), 4);
        gone.abort();
        let _ = gone.await;
        assert_eq!(TURNS.waiting(), 3, "an aborted waiter leaves the queue");
        drop(first);
        for t in [a1, a2, b1] {
            t.await.expect("task");
        }
        assert_eq!(*order.lock().unwrap(), ["a1", "b1", "a2"]);
        // A waiter handed the turn and dropped before it ran passes it on.
        let held = TURNS.take(a).await;
        let mut handed = Box::pin(TURNS.take(b));
        assert!(futures_poll(&mut handed).is_none(), "waits while the turn is held");
        drop(held);
        drop(handed);
        let again = tokio::time::timeout(Duration::from_secs(1), TURNS.take(a)).await;
        assert!(again.is_ok(), "the turn was passed on, not lost");
    }

    /// Polls a future once.
    fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
