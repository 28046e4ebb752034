"""The Gluon forward's K/V ring (gluon_attention.py, hopper.Ring) as a model in plain Python, on a CPU.

Gluon has no interpreter, so the hand-off between the loader warp and the softmax warpgroups cannot
be stepped through on a CPU. This model keeps the kernel's rule and nothing else: key tile `it`
goes to slot it % STAGES, in round it // STAGES; the loader waits on free[slot] with parity
(round & 1) ^ 1 before it copies the tile in, and the copy completes a phase of ready[slot]; each
warpgroup waits on ready[slot] with parity round & 1, reads the tile and arrives on free[slot],
which completes a phase once every warpgroup has arrived. The K ring is modelled; the V ring
follows the same rule (its free barrier is arrived on one step later, after P V).

    run(6, 2, 2)   # 6 key tiles, STAGES = 2, two warpgroups: (events, errors)

The tests run it under many interleavings and check that it never deadlocks, that the loader never
overwrites a slot some warpgroup has not released, and that no warpgroup reads a stale tile.
"""


class Barrier:
    """An mbarrier: `count` arrivals complete its current phase (0, 1, 2, ...)."""

    def __init__(self, count):
        self.count, self.arrived, self.completed = count, 0, 0  # completed: phases done so far

    def passes(self, parity):
        """mbarrier.wait(bar, parity) returns once the phase of that parity just before the current one
        has completed. A fresh barrier (current phase 0) counts as having completed phase -1, of
        parity 1: a first wait with parity 1 passes at once, one with parity 0 waits."""
        return self.completed % 2 != parity

    def arrive(self):
        """One arrival; the phase it completes, or None."""
        self.arrived += 1
        if self.arrived < self.count:
            return None
        self.arrived, self.completed = 0, self.completed + 1
        return self.completed - 1


def loader(n_tiles, stages):
    """_load_partition: each key tile into its slot once the slot is free. Yields the wait it makes
    before each copy: (tile, slot, barrier, parity)."""
    for it in range(n_tiles):
        slot, phase = it % stages, (it // stages) & 1
        yield it, slot, "free", phase ^ 1  # Ring.fill: mbarrier.wait(free.index(slot), phase ^ 1), then TMA


def consumer(n_tiles, stages):
    """_softmax_partition and _softmax_step: each key tile once it has landed. Yields the wait it
    makes before reading the tile (S = Q K^T) and arriving on free[slot]."""
    for it in range(n_tiles):
        slot, phase = it % stages, (it // stages) & 1
        yield it, slot, "ready", phase  # Ring.wait: mbarrier.wait(ready.index(slot), phase)


def run(n_tiles, stages, consumers, pick=None, free_count=None, load=loader):
    """Run one loader and `consumers` warpgroups over n_tiles key tiles, one step at a time.
    pick(names) chooses which of the actors whose wait passes goes next (default: the first, the
    loader before warpgroup 0 before warpgroup 1). free_count: arrivals that complete a free phase
    (the kernel's count, WARPGROUPS, by default). Returns (events, errors): an event per wait
    (dicts: who, tile, slot, barrier, parity, blocked, and after the wait the phase it completed),
    errors: "deadlock", "overwrite" and "stale read" messages (none when the rule holds)."""
    ready = [Barrier(1) for _ in range(stages)]  # the loader's copy landing
    free = [Barrier(free_count or consumers) for _ in range(stages)]  # every warpgroup done with the slot
    barriers = {"ready": ready, "free": free}
    held = [None] * stages  # the key tile in each slot
    readers = [set() for _ in range(stages)]  # the warpgroups that have read it
    actors = {"loader": load(n_tiles, stages)}
    actors |= {f"warpgroup {w}": consumer(n_tiles, stages) for w in range(consumers)}
    waiting = {name: next(gen, None) for name, gen in actors.items()}
    blocked = set()
    events, errors = [], []
    while any(w is not None for w in waiting.values()):
        runnable = []
        for name, w in waiting.items():
            if w is None:
                continue
            it, slot, barrier, parity = w
            if barriers[barrier][slot].passes(parity):
                runnable.append(name)
            elif name not in blocked:  # the first time this wait fails
                blocked.add(name)
                events.append(dict(who=name, tile=it, slot=slot, barrier=barrier, parity=parity, blocked=True))
        if not runnable:
            errors.append(f"deadlock: {', '.join(f'{n} waits on {w[2]}[{w[1]}]' for n, w in waiting.items() if w)}")
            break
        name = (pick or (lambda names: names[0]))(runnable)
        it, slot, barrier, parity = waiting[name]
        event = dict(who=name, tile=it, slot=slot, barrier=barrier, parity=parity, blocked=False)
        event["waited"] = name in blocked
        blocked.discard(name)
        if name == "loader":  # the TMA copy: the tile lands in the slot and completes a phase of ready
            if held[slot] is not None and len(readers[slot]) < consumers:
                errors.append(f"overwrite: tile {it} into slot {slot} before every warpgroup read tile {held[slot]}")
            held[slot], readers[slot] = it, set()
            event["completes"] = ready[slot].arrive()
        else:  # S = Q K^T reads the slot, then Ring.release: mbarrier.arrive(free.index(slot))
            if held[slot] != it:
                errors.append(f"stale read: {name} read slot {slot} for tile {it} but it holds {held[slot]}")
            readers[slot].add(name)
            event["completes"] = free[slot].arrive()
            event["arrivals"] = free[slot].arrived or free[slot].count
        events.append(event)
        waiting[name] = next(actors[name], None)
    return events, errors


def story(events, stages, consumers):
    """run()'s events as the walkthrough prints them: a header, then one line per wait."""
    lines = ["who          tile  slot  phase bit  waits on  parity  then"]
    for e in events:
        b, s, p, it = e["barrier"], e["slot"], e["parity"], e["tile"]
        what = f"{e['who']:<12} K_{it}   {s:>4}  {(it // stages) & 1:>9}  {f'{b}[{s}]':<8}  {p:>6}  "
        if e["blocked"]:
            lines.append(what + "blocks")
            continue
        how = "now passes" if e["waited"] else "passes"
        if e["who"] == "loader":
            fresh = " (a fresh barrier: phase -1 counts as done)" if it < stages and not e["waited"] else ""
            lines.append(what + f"{how}{fresh}; K_{it} lands: ready[{s}] completes phase {e['completes']}")
            continue
        line = what + f"{how}; reads K_{it}, arrives on free[{s}] ({e['arrivals']} of {consumers})"
        if e["completes"] is not None:
            line += f": free[{s}] completes phase {e['completes']}, parity-{e['completes'] & 1} waits pass"
        lines.append(line)
    return lines
