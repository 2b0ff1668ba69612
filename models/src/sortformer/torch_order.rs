//! `torch.topk(largest=True, sorted=False)` and `torch.sort()` on the CPU, including the order
//! they leave equal values in.
//!
//! Ties are the rule, not the exception, in cache compression: a frame can sit in the cache
//! once per speaker with identical scores, and disabled frames all score −∞. Which duplicate
//! survives changes the cache order and therefore the model's next outputs, so parity with NeMo
//! needs torch's exact selection. torch's CPU kernel (`TopKImpl.h`) fills `(value, index)`
//! pairs in index order and runs libstdc++'s `std::partial_sort` when `64·k <= n`, otherwise
//! `std::nth_element`, with the comparator `a.value > b.value`; the first `k` pairs are the
//! result. `torch.sort(stable=False)` is libstdc++'s `std::sort` (introsort, insertion sort
//! below 17 elements) with `a < b`; post-processing sorts segment starts that can tie.
//! The libstdc++ algorithms are reproduced step for step below.

type Pair = (f32, usize);

fn greater(a: &Pair, b: &Pair) -> bool {
    a.0 > b.0
}

fn less(a: &Pair, b: &Pair) -> bool {
    a.0 < b.0
}

/// libstdc++ `std::sort` threshold below which the introsort loop stops.
const SORT_THRESHOLD: usize = 16;

/// `values.sort()[1]`: the permutation torch's unstable ascending sort produces.
pub(crate) fn sort_indices(values: &[f32]) -> Vec<usize> {
    let mut v: Vec<Pair> = values.iter().copied().zip(0..).collect();
    if v.len() > 1 {
        let depth = 2 * floor_log2(v.len());
        introsort_loop(&mut v, 0, depth, less);
        final_insertion_sort(&mut v, less);
    }
    v.into_iter().map(|p| p.1).collect()
}

fn introsort_loop(v: &mut [Pair], first: usize, mut depth_limit: usize, comp: Cmp) {
    let mut last = v.len();
    while last - first > SORT_THRESHOLD {
        if depth_limit == 0 {
            // __partial_sort(first, last, last): a heap sort of the range.
            let range = &mut v[first..last];
            let n = range.len();
            heap_select(range, n, comp);
            sort_heap(range, n, comp);
            return;
        }
        depth_limit -= 1;
        let cut = partition_pivot(v, first, last, comp);
        introsort_loop(&mut v[..last], cut, depth_limit, comp);
        last = cut;
    }
}

fn final_insertion_sort(v: &mut [Pair], comp: Cmp) {
    if v.len() > SORT_THRESHOLD {
        insertion_sort(&mut v[..SORT_THRESHOLD], comp);
        for i in SORT_THRESHOLD..v.len() {
            unguarded_linear_insert(v, i, comp);
        }
    } else {
        insertion_sort(v, comp);
    }
}

type Cmp = fn(&Pair, &Pair) -> bool;

/// Indices of the `k` largest `values`, in the (unsorted) order torch returns them.
pub(crate) fn topk_indices(values: &[f32], k: usize) -> Vec<usize> {
    let k = k.min(values.len());
    if k == 0 {
        return Vec::new();
    }
    let mut queue: Vec<Pair> = values.iter().copied().zip(0..).collect();
    if k * 64 <= queue.len() {
        heap_select(&mut queue, k, greater);
        sort_heap(&mut queue, k, greater);
    } else {
        nth_element(&mut queue, k - 1);
    }
    queue[..k].iter().map(|p| p.1).collect()
}

/// `std::nth_element(first, first + nth, last, greater)`.
fn nth_element(v: &mut [Pair], nth: usize) {
    if v.is_empty() || nth >= v.len() {
        return;
    }
    let depth_limit = 2 * floor_log2(v.len());
    introselect(v, nth, depth_limit);
}

fn floor_log2(n: usize) -> usize {
    (usize::BITS - 1 - n.leading_zeros()) as usize
}

/// libstdc++ `__introselect` on `v[first..last]`, positions absolute.
fn introselect(v: &mut [Pair], nth: usize, mut depth_limit: usize) {
    let (mut first, mut last) = (0, v.len());
    while last - first > 3 {
        if depth_limit == 0 {
            heap_select(&mut v[first..last], nth + 1 - first, greater);
            v.swap(first, nth);
            return;
        }
        depth_limit -= 1;
        let cut = partition_pivot(v, first, last, greater);
        if cut <= nth {
            first = cut;
        } else {
            last = cut;
        }
    }
    insertion_sort(&mut v[first..last], greater);
}

/// `__unguarded_partition_pivot`: median of (first+1, mid, last−1) moved to `first`, then
/// Hoare partition of `first+1..last` around it.
fn partition_pivot(v: &mut [Pair], first: usize, last: usize, comp: Cmp) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(v, first, first + 1, mid, last - 1, comp);
    let pivot = first;
    let (mut lo, mut hi) = (first + 1, last);
    loop {
        while comp(&v[lo], &v[pivot]) {
            lo += 1;
        }
        hi -= 1;
        while comp(&v[pivot], &v[hi]) {
            hi -= 1;
        }
        if lo >= hi {
            return lo;
        }
        v.swap(lo, hi);
        lo += 1;
    }
}

fn move_median_to_first(v: &mut [Pair], result: usize, a: usize, b: usize, c: usize, comp: Cmp) {
    let chosen = if comp(&v[a], &v[b]) {
        if comp(&v[b], &v[c]) {
            b
        } else if comp(&v[a], &v[c]) {
            c
        } else {
            a
        }
    } else if comp(&v[a], &v[c]) {
        a
    } else if comp(&v[b], &v[c]) {
        c
    } else {
        b
    };
    v.swap(result, chosen);
}

fn insertion_sort(v: &mut [Pair], comp: Cmp) {
    for i in 1..v.len() {
        let val = v[i];
        if comp(&val, &v[0]) {
            v.copy_within(0..i, 1);
            v[0] = val;
        } else {
            unguarded_linear_insert(v, i, comp);
        }
    }
}

fn unguarded_linear_insert(v: &mut [Pair], mut hole: usize, comp: Cmp) {
    let val = v[hole];
    while comp(&val, &v[hole - 1]) {
        v[hole] = v[hole - 1];
        hole -= 1;
    }
    v[hole] = val;
}

/// `__sort_heap` on `v[..len]`.
fn sort_heap(v: &mut [Pair], len: usize, comp: Cmp) {
    let mut last = len;
    while last > 1 {
        last -= 1;
        pop_heap(v, 0, last, last, comp);
    }
}

/// `__heap_select(first, first + middle, last)`.
fn heap_select(v: &mut [Pair], middle: usize, comp: Cmp) {
    make_heap(&mut v[..middle], comp);
    for i in middle..v.len() {
        if comp(&v[i], &v[0]) {
            pop_heap(v, 0, middle, i, comp);
        }
    }
}

fn make_heap(v: &mut [Pair], comp: Cmp) {
    let len = v.len();
    if len < 2 {
        return;
    }
    let mut parent = (len - 2) / 2;
    loop {
        let value = v[parent];
        adjust_heap(v, parent, len, value, comp);
        if parent == 0 {
            return;
        }
        parent -= 1;
    }
}

/// `__pop_heap(first, last, result)`: the heap is `v[first..last]`.
fn pop_heap(v: &mut [Pair], first: usize, last: usize, result: usize, comp: Cmp) {
    let value = v[result];
    v[result] = v[first];
    adjust_heap(&mut v[first..last], 0, last - first, value, comp);
}

fn adjust_heap(v: &mut [Pair], mut hole: usize, len: usize, value: Pair, comp: Cmp) {
    let top = hole;
    let mut second = hole;
    while second < len.saturating_sub(1) / 2 {
        second = 2 * (second + 1);
        if comp(&v[second], &v[second - 1]) {
            second -= 1;
        }
        v[hole] = v[second];
        hole = second;
    }
    if len & 1 == 0 && len >= 2 && second == (len - 2) / 2 {
        second = 2 * (second + 1);
        v[hole] = v[second - 1];
        hole = second - 1;
    }
    // __push_heap
    while hole > top {
        let parent = (hole - 1) / 2;
        if !comp(&v[parent], &value) {
            break;
        }
        v[hole] = v[parent];
        hole = parent;
    }
    v[hole] = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_the_k_largest() {
        let values: Vec<f32> = (0..300).map(|i| ((i * 37) % 101) as f32).collect();
        for k in [1, 3, 4, 10, 40, 100, 299, 300] {
            let mut got: Vec<f32> = topk_indices(&values, k)
                .iter()
                .map(|&i| values[i])
                .collect();
            let mut want = values.clone();
            want.sort_by(|a, b| b.total_cmp(a));
            want.truncate(k);
            got.sort_by(|a, b| b.total_cmp(a));
            assert_eq!(got, want, "k = {k}");
        }
        assert!(topk_indices(&values, 0).is_empty());
    }

    #[test]
    fn sort_orders_ties_as_torch_does() {
        // torch 2.x CPU, `torch.cat([zeros(t), arange(1, n + 1)]).sort()[1][:t + 1]`.
        let cases: [(usize, usize, &[usize]); 6] = [
            (8, 4, &[0, 1, 2, 3, 4]),
            (16, 2, &[1, 0, 2]),
            (16, 4, &[1, 2, 3, 0, 4]),
            (30, 3, &[1, 0, 2, 3]),
            (30, 4, &[1, 0, 3, 2, 4]),
            (200, 4, &[1, 0, 3, 2, 4]),
        ];
        for (n, ties, want) in cases {
            let values: Vec<f32> = std::iter::repeat_n(0.0, ties)
                .chain((1..=n).map(|i| i as f32))
                .collect();
            let got = sort_indices(&values);
            assert_eq!(&got[..=ties], want, "n = {n}, ties = {ties}");
            assert!(got.windows(2).all(|w| values[w[0]] <= values[w[1]]));
        }
    }

    #[test]
    fn partial_sort_path_is_sorted_descending() {
        let values: Vec<f32> = (0..640).map(|i| ((i * 53) % 97) as f32).collect();
        let got: Vec<f32> = topk_indices(&values, 10)
            .iter()
            .map(|&i| values[i])
            .collect();
        assert!(got.windows(2).all(|w| w[0] >= w[1]));
    }
}
