"""Pairwise (2-way) covering arrays with constraints and several capability groups.

A small greedy generator in the style of AETG (Cohen et al., 1997): no library in the
environment handles what the suite needs - constraints given as tables over a few axes, and
coverage counted per *group* of allowed values (a kernel's capabilities), where a row covers
a pair for a group only when every value of the row is allowed to that group.

    axes        {axis: (value, ...)}, values in order of preference (the first is cheapest)
    constraints [Constraint(axes, allowed tuples)]: a full row is valid when its projection on
                the axes of every constraint is one of the allowed tuples
    groups      {group: {axis: allowed values}} (an axis left out allows every value)

`targets` lists every (group, pair) for which some valid row allowed to the group holds the
pair; `generate` returns rows (dicts) covering all of them; `coverage` counts what a given
list of rows covers. Deterministic: the same input gives the same rows, in the same order.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

Pair = tuple[tuple[str, str], tuple[str, str]]  # ((axis a, value), (axis b, value)), a before b in axis order


@dataclass(frozen=True)
class Constraint:
    """The allowed value tuples of a few axes (all other axes unconstrained by it)."""
    axes: tuple[str, ...]
    allowed: frozenset  # of tuples, one value per axis in `axes`
    why: str = ""
    _proj: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def from_predicate(cls, axes_table: Mapping[str, Sequence[str]], axes: Sequence[str], pred, why: str = ""):
        allowed = frozenset(t for t in itertools.product(*(axes_table[a] for a in axes)) if pred(*t))
        return cls(tuple(axes), allowed, why)

    def _projections(self, idx: tuple[int, ...]) -> frozenset:
        p = self._proj.get(idx)
        if p is None:
            p = frozenset(tuple(t[i] for i in idx) for t in self.allowed)
            self._proj[idx] = p
        return p

    def compatible(self, row: Mapping[str, str]) -> bool:
        """False when the values of `row` on this constraint's axes (some may be unassigned)
        cannot be extended to an allowed tuple."""
        idx = tuple(i for i, a in enumerate(self.axes) if a in row)
        if not idx:
            return True
        return tuple(row[self.axes[i]] for i in idx) in self._projections(idx)


class CoveringProblem:
    def __init__(self, axes: Mapping[str, Sequence[str]], constraints: Iterable[Constraint] = (),
                 groups: Optional[Mapping[str, Mapping[str, Iterable[str]]]] = None):
        self.axes = {a: tuple(v) for a, v in axes.items()}
        self.order = list(self.axes)
        self.constraints = list(constraints)
        for c in self.constraints:
            unknown = [a for a in c.axes if a not in self.axes]
            if unknown:
                raise ValueError(f"constraint {c.why or c.axes}: unknown axes {unknown}")
        self._by_axis = {a: [c for c in self.constraints if a in c.axes] for a in self.axes}
        groups = groups or {"all": {}}
        self.groups = {g: {a: tuple(v for v in self.axes[a] if v in set(allow.get(a, self.axes[a])))
                           for a in self.axes} for g, allow in groups.items()}
        self._feasible_cache: dict = {}

    def fingerprint(self) -> str:
        """A hash of everything `generate` reads - the axes in order, each constraint's allowed
        tuples, each group's domains - and of this module's source (the algorithm): problems
        with equal fingerprints get equal rows from `generate()`."""
        import hashlib
        import json
        import pathlib
        data = {"order": self.order, "axes": self.axes, "groups": self.groups,
                "constraints": [[list(c.axes), sorted(map(list, c.allowed))] for c in self.constraints]}
        h = hashlib.sha256(json.dumps(data, sort_keys=True).encode())
        h.update(pathlib.Path(__file__).read_bytes().replace(b"\r\n", b"\n"))
        return h.hexdigest()[:16]

    # ---- validity ---------------------------------------------------------------------
    def compatible(self, row: Mapping[str, str], changed: Optional[str] = None) -> bool:
        cons = self._by_axis[changed] if changed is not None else self.constraints
        return all(c.compatible(row) for c in cons)

    def allowed(self, group: str, row: Mapping[str, str]) -> bool:
        dom = self.groups[group]
        return all(v in dom[a] for a, v in row.items())

    def completion(self, row: Mapping[str, str], group: Optional[str] = None) -> Optional[dict]:
        """A valid full row extending `row` (with values allowed to `group`), or None."""
        key = (group, tuple(sorted(row.items())))
        if key in self._feasible_cache:
            hit = self._feasible_cache[key]
            return dict(hit) if hit is not None else None
        dom = self.groups[group] if group is not None else self.axes
        if any(v not in dom[a] for a, v in row.items()) or not self.compatible(row):
            self._feasible_cache[key] = None
            return None
        todo = [a for a in self.order if a not in row]
        # most constrained first: fewer values and more constraints
        todo.sort(key=lambda a: (len(dom[a]), -len(self._by_axis[a])))
        cur = dict(row)

        def rec(i: int) -> bool:
            if i == len(todo):
                return True
            a = todo[i]
            for v in dom[a]:
                cur[a] = v
                if self.compatible(cur, a) and rec(i + 1):
                    return True
            del cur[a]
            return False

        found = dict(cur) if rec(0) else None
        self._feasible_cache[key] = tuple(sorted(found.items())) if found else None
        return found

    def valid(self, row: Mapping[str, str]) -> bool:
        return len(row) == len(self.axes) and self.compatible(row)

    # ---- targets ------------------------------------------------------------------------
    def pairs(self) -> list[Pair]:
        out = []
        for i, a in enumerate(self.order):
            for b in self.order[i + 1:]:
                for va in self.axes[a]:
                    for vb in self.axes[b]:
                        out.append(((a, va), (b, vb)))
        return out

    def targets(self) -> dict[str, list[Pair]]:
        """{group: [pair, ...]}: the pairs some valid row allowed to the group holds."""
        out = {}
        for g in self.groups:
            out[g] = [p for p in self.pairs() if self.completion(dict(p), g) is not None]
        return out

    @staticmethod
    def row_pairs(row: Mapping[str, str], order: Sequence[str]) -> list[Pair]:
        keys = [a for a in order if a in row]
        return [((a, row[a]), (b, row[b])) for i, a in enumerate(keys) for b in keys[i + 1:]]

    def coverage(self, rows: Iterable[Mapping[str, str]]) -> dict[str, tuple[set, set]]:
        """{group: (covered target pairs, all target pairs)}."""
        targets = self.targets()
        covered = {g: set() for g in self.groups}
        for row in rows:
            for g in self.groups:
                if self.allowed(g, row):
                    covered[g].update(self.row_pairs(row, self.order))
        return {g: (covered[g] & set(targets[g]), set(targets[g])) for g in self.groups}

    # ---- generation ---------------------------------------------------------------------
    def generate(self, seed_rows: Iterable[Mapping[str, str]] = (), candidates: int = 1) -> list[dict]:
        """Rows covering every target pair of every group, greedily: each new row starts from
        an uncovered (group, pair), then fixes the remaining axes one at a time, taking the
        value that covers the most uncovered pairs (ties: the earlier value in the table),
        keeping the row completable and allowed to its group (a value's worth is every pair
        of the row so far, so a value that leaves a group's capabilities costs that group's
        pairs). `candidates` > 1 builds that many rows from different seeds per step and keeps
        the best. Last, rows whose pairs the others all cover are dropped. `seed_rows` count
        as covered already (rows that exist anyway) and are not returned."""
        targets = self.targets()
        uncovered = {g: set(ps) for g, ps in targets.items()}
        rank = {a: i for i, a in enumerate(self.order)}
        ordered = {g: sorted(ps, key=lambda p: (rank[p[0][0]], rank[p[1][0]], self.axes[p[0][0]].index(p[0][1]),
                                                self.axes[p[1][0]].index(p[1][1])))
                   for g, ps in targets.items()}
        for row in seed_rows:
            self._mark(uncovered, row)
        rows: list[dict] = []
        while any(uncovered.values()):
            weight = {a: 0 for a in self.order}
            for ps in uncovered.values():
                for (a, _), (b, _) in ps:
                    weight[a] += 1
                    weight[b] += 1
            best, best_gain = None, -1
            for k, (g, pair) in enumerate(self._seeds(uncovered, ordered, candidates)):
                row = self._build(g, dict(pair), uncovered, weight, rank, rotate=k)
                if row is None:
                    continue
                gain = self._gain_row(uncovered, row)
                if gain > best_gain:
                    best, best_gain = row, gain
            if best is None or best_gain <= 0:
                left = {g: sorted(ps)[:3] for g, ps in uncovered.items() if ps}
                raise RuntimeError(f"pairwise generation stuck; uncovered e.g. {left}")
            rows.append(best)
            self._mark(uncovered, best)
        return self._reduce(rows, targets)

    def _reduce(self, rows: list[dict], targets: dict) -> list[dict]:
        """Drop rows (last first) whose pairs the other rows all cover for every group."""
        holds = [{g: set(self.row_pairs(r, self.order)) if self.allowed(g, r) else set() for g in self.groups}
                 for r in rows]
        keep = list(range(len(rows)))
        for i in reversed(range(len(rows))):
            others = [j for j in keep if j != i]
            if all(not (holds[i][g] & set(targets[g])) or
                   (holds[i][g] & set(targets[g])) <= set().union(*(holds[j][g] for j in others)) for g in self.groups):
                keep = others
        return [rows[i] for i in keep]

    @staticmethod
    def _seeds(uncovered, ordered, n):
        """The first uncovered (group, pair) of each group in turn (groups with most left first)."""
        groups = sorted((g for g in uncovered if uncovered[g]), key=lambda g: (-len(uncovered[g]), g))
        firsts = {g: [p for p in ordered[g] if p in uncovered[g]][:n] for g in groups}
        out = []
        for i in range(n):
            for g in groups:
                if i < len(firsts[g]) and len(out) < n:
                    out.append((g, firsts[g][i]))
        return out

    def _build(self, g, row, uncovered, weight, rank, rotate=0):
        if self.completion(row, g) is None:
            return None
        todo = [a for a in self.order if a not in row]
        # axes with more uncovered pairs first; `rotate` varies the order between candidates
        todo.sort(key=lambda a: (-weight[a], rank[a]))
        if todo and rotate:
            r = rotate % len(todo)
            todo = todo[r:] + todo[:r]
        for a in todo:
            best_v, best_gain = None, -1
            for v in self.groups[g][a]:
                row[a] = v
                if not self.compatible(row, a):
                    continue
                gain = self._gain_row(uncovered, row)  # all pairs so far: a value that drops a group loses its pairs
                if gain > best_gain and self.completion(row, g) is not None:
                    best_v, best_gain = v, gain
            if best_v is None:
                return None
            row[a] = best_v
        return row

    def _alive(self, row):
        return [g for g in self.groups if self.allowed(g, row)]

    def _gain_row(self, uncovered, row):
        pairs = self.row_pairs(row, self.order)
        return sum(1 for g in self._alive(row) for p in pairs if p in uncovered[g])

    def _mark(self, uncovered, row):
        pairs = self.row_pairs(row, self.order)
        for g in self._alive(row):
            uncovered[g].difference_update(pairs)
