"""Where a node log's measured run begins, for the step scripts beside it.

A GPU-host run's log holds warm-ups, then the trace's run, each after a
stretch with no step in flight. The run can hold such a stretch too: at a
low rate a model can finish its requests before the next arrives (the
seed-7 trace at rate 2 idles 0.66 s eight seconds in). Taking the last
stretch for the run's start then clocks the node from the wrong step.

run_start picks, among the steps that follow a stretch of at least gap_s
with nothing in flight (and the first step), the one whose clock puts
each model's first step closest to the simulated run's (the mean absolute
difference over the models both ran; a tie goes to the later start).
Without the simulator's first steps it keeps the old rule, the last such
step.
"""


def run_start(steps, gap_s, sim_first=None):
    """Index into `steps` of the run's first step.

    steps: (model, begin_s, end_s, ...) sorted by begin_s.
    sim_first: {model: its first simulated step's start, seconds from the
    simulated run's first step}, or None.
    """
    if not steps:
        return 0
    starts, end = [0], steps[0][2]
    for i in range(1, len(steps)):
        if steps[i][1] - end >= gap_s:
            starts.append(i)
        end = max(end, steps[i][2])
    if not sim_first:
        return starts[-1]
    best, best_cost = starts[-1], float("inf")
    for i in starts:
        t0, first = steps[i][1], {}
        for s in steps[i:]:
            first.setdefault(s[0], s[1] - t0)
        both = [m for m in sim_first if m in first]
        if not both:
            continue
        cost = sum(abs(first[m] - sim_first[m]) for m in both) / len(both)
        if cost <= best_cost:
            best, best_cost = i, cost
    return best


def first_steps(rows):
    """{model: first start} of (model, start_s, ...) rows, seconds from the
    earliest."""
    if not rows:
        return {}
    t0 = min(r[1] for r in rows)
    first = {}
    for r in sorted(rows, key=lambda r: r[1]):
        first.setdefault(r[0], r[1] - t0)
    return first
