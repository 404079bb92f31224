//! Work fanned out onto scoped threads: [`on_each`] runs a closure on each item, one thread an
//! item, and [`join_all`] collects scoped threads' results, a panic of one passed on.

/// `work` of each of `items`, the first on this thread and each other on a thread of its own;
/// the results in the items' order.
pub(crate) fn on_each<I, R>(items: I, work: impl Fn(I::Item) -> R + Sync) -> Vec<R>
where
    I: IntoIterator,
    I::Item: Send,
    R: Send,
{
    let mut items = items.into_iter();
    let Some(first) = items.next() else {
        return Vec::new();
    };
    std::thread::scope(|scope| {
        let work = &work;
        let handles: Vec<_> = items.map(|item| scope.spawn(move || work(item))).collect();
        let mut results = vec![work(first)];
        results.extend(join_all(handles));
        results
    })
}

/// The results of scoped threads, in order; a thread's panic goes on in the caller.
pub(crate) fn join_all<T>(handles: Vec<std::thread::ScopedJoinHandle<'_, T>>) -> Vec<T> {
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
        .collect()
}
