//! What every bench main does: the workloads of one area (the first part
//! of their names, see `efapoll_perf::workloads`) under criterion.

use criterion::{Criterion, Throughput};
use efapoll_perf::workloads::{self, Unit};

/// Benches every workload named `area/...`: criterion's group is the name
/// up to its last '/', the bench the rest; the cost is per operation.
pub fn bench_area(c: &mut Criterion, area: &str) {
    for w in workloads::all().into_iter().filter(|w| w.name.split('/').next() == Some(area)) {
        let (group, id) = w.name.rsplit_once('/').expect("names are area/case");
        let mut g = c.benchmark_group(group);
        g.throughput(match w.unit {
            Unit::Ops => Throughput::Elements(1),
            Unit::Bytes(n) => Throughput::Bytes(n),
        });
        // Operations of milliseconds: fewer samples, or a bench takes minutes.
        if w.iters < 10_000 {
            g.sample_size(10);
        }
        // Set up only when criterion runs the bench (not when filtered out).
        let mut runner = None;
        g.bench_function(id, |b| {
            let runner = runner.get_or_insert_with(|| w.setup());
            b.iter_custom(|n| runner.run_timed(n))
        });
        g.finish();
    }
}
