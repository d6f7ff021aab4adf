"""What a Slurm task runs on its node and how the controller reads back what it said.

:data:`TASK` is the shell each task of the fleet's step runs (edges/slurm.py's docstring says in
which order): it prints what happened as ``@sg KEY BASE64`` lines, its frame, each value in lines
short enough that srun, which cuts lines at 1 KiB, never cuts one. :class:`FrameReader` reads
frames as srun's labelled output arrives; everything else is dropped, and each value is kept up to
its cap (:data:`MAX_VALUE` for the report, :data:`MAX_SMALL` for the rest).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

__all__ = ["MAX_LINE", "MAX_SMALL", "MAX_VALUE", "TASK", "Frame", "FrameReader", "parse_frames", "read_lines"]

_LABEL = re.compile(r"^\s*(\d+): (.*)$")
#: Largest base64 frame value read back (a report is read whole: a bigger one is not a stackgate report).
MAX_VALUE = 96 << 20
#: ... of every other value (a version, a failure, a last line: each a line or a few).
MAX_SMALL = 64 << 10
#: A line of srun's output longer than this is no frame line (those are under 1 KiB): dropped unread.
MAX_LINE = 64 << 10
#: The value a task's frame carries whole (its report): the others are small.
_LARGE = "report"


#: What each task runs (``sh -c TASK sh ARGS``): see the module's docstring. Its arguments: the
#: node's stackgate, the version it must have, the node folder the files were sent to, this run's
#: token, the shared folder ("" for none), the number of files, then a name and a sha256 for each
#: file, then the action's arguments (the spec named relative to the task's folder).
TASK = r"""
sg=$1 want=$2 base=$3 token=$4 shared=$5 count=$6; shift 6
node=${SLURMD_NODENAME:-$(hostname)}
out=/dev/stdout
[ -n "$shared" ] && out="$shared/$node.frame.$token" && : > "$out"
emit() { printf '@sg %s \n' "$1" >> "$out"; printf '%s' "$2" | base64 -w 700 | sed "s/^/@sg $1 /" >> "$out"; }
t0=$(date +%s%N)
emit node "$node"
emit step "${SLURM_JOB_ID:-}.${SLURM_STEP_ID:-}"
d=$(mktemp -d "$base/stackgate-fleet.XXXXXXXX") || { emit failed "cannot make a folder in $base on the node"; exit 3; }
trap 'rm -rf -- "$d"' EXIT
i=0
while [ $i -lt "$count" ]; do
  name=$1 sum=$2; shift 2
  if ! mv -- "$base/stackgate-fleet.$token.$i" "$d/$name" 2>/dev/null; then
    emit failed "$name did not arrive (sbcast)"; exit 3
  fi
  got=$(sha256sum < "$d/$name" | cut -d' ' -f1)
  if [ "$got" != "$sum" ]; then emit failed "$name arrived damaged: sha256 $got on the node, $sum here"; exit 3; fi
  i=$((i+1))
done
"$sg" --version > "$d/.version" 2>&1; rc=$?
v=$(head -c 4096 "$d/.version")
emit version "$v"
if [ $rc -ne 0 ]; then
  emit failed "\`$sg --version\` on the node: exit $rc: $(printf '%s' "$v" | tail -n 1 | cut -c1-300)"; exit 3
fi
if [ "$v" != "stackgate $want" ]; then
  emit failed "the node has ${v#stackgate }, this controller stackgate $want: install the same version on every node"
  exit 3
fi
cd "$d" || exit 3
trap ':' TERM INT HUP
NO_COLOR=1 "$sg" "$@" --json report.json < /dev/null > output 2>&1 &
pid=$!
emit started "$pid"
wait $pid; rc=$?
while kill -0 $pid 2>/dev/null; do wait $pid; rc=$?; done
emit exit "$rc"
emit tail "$(grep -v '^[[:space:]]*$' output | tail -n 1 | cut -c1-300)"
emit duration_ns "$(( $(date +%s%N) - t0 ))"
if [ -f report.json ]; then
  emit report_sha256 "$(head -c 67108865 report.json | sha256sum | cut -d' ' -f1)"
  printf '@sg report \n' >> "$out"
  head -c 67108865 report.json | base64 -w 700 | sed 's/^/@sg report /' >> "$out"
fi
cd / && rm -rf -- "$d"
exit 0
"""


@dataclass
class Frame:
    """What one node's task said: its fields (node, version, failed, exit, tail, report, ...)."""

    task: int | None
    fields: dict[str, str] = field(default_factory=dict)
    cut: frozenset[str] = frozenset()  #: values over their cap: dropped

    @property
    def node(self) -> str | None:
        return self.fields.get("node")


class FrameReader:
    """Frames read line by line as srun's output arrives (``N: @sg KEY BASE64``, a value's first
    line with nothing after the key, its pieces after it); other lines are not kept, and a value
    over its cap (:data:`MAX_VALUE` for the report, :data:`MAX_SMALL` for the rest, and as many
    keys as fit in twice that) is dropped and named in the frame's ``cut``."""

    def __init__(self, labelled: bool = True) -> None:
        self.labelled = labelled
        self._pieces: dict[int | None, dict[str, list[str]]] = {}
        self._sizes: dict[int | None, dict[str, int]] = {}
        self._cut: dict[int | None, set[str]] = {}

    def add(self, line: str) -> None:
        task, text = None, line.rstrip("\n")
        if self.labelled:
            matched = _LABEL.match(text)
            if matched is None:
                return
            task, text = int(matched.group(1)), matched.group(2)
        words = text.split(" ", 2)
        if len(words) != 3 or words[0] != "@sg":
            return
        key, piece = words[1], words[2].strip()
        values, sizes = self._pieces.setdefault(task, {}), self._sizes.setdefault(task, {})
        if not piece:
            values[key], sizes[key] = [], 0  # a value begins (again)
            self._cut.get(task, set()).discard(key)
            return
        cap = MAX_VALUE if key == _LARGE else MAX_SMALL
        total = sum(sizes.values())
        if key in self._cut.get(task, ()):
            return
        if sizes.get(key, 0) + len(piece) > cap or total + len(piece) > MAX_VALUE + 2 * MAX_SMALL:
            self._cut.setdefault(task, set()).add(key)
            values.pop(key, None)
            sizes.pop(key, None)
            return
        values.setdefault(key, []).append(piece)
        sizes[key] = sizes.get(key, 0) + len(piece)

    def frames(self) -> list[Frame]:
        tasks = dict.fromkeys([*self._pieces, *self._cut])
        return [Frame(task, _decoded(self._pieces.get(task, {})), frozenset(self._cut.get(task, ()))) for task in tasks]


def parse_frames(lines: Sequence[str], labelled: bool = True) -> list[Frame]:
    """The frames in srun's labelled output (:class:`FrameReader`); a value that is not base64,
    not text or too large is dropped.

    >>> lines = ["0: @sg node ", "0: @sg node bjE=", "noise", "1: @sg node ", "1: @sg node bjI="]
    >>> lines += ["0: @sg exit ", "0: @sg exit MA=="]
    >>> [f.fields for f in parse_frames(lines)]
    [{'node': 'n1', 'exit': '0'}, {'node': 'n2'}]
    """
    reader = FrameReader(labelled)
    for line in lines:
        reader.add(line)
    return reader.frames()


def read_lines(stream: object, on_line: Callable[[str], None], max_line: int = MAX_LINE) -> None:
    """Each line of a binary stream, as text, to ``on_line`` as it arrives; a line longer than
    ``max_line`` is dropped whole, never held (what a node prints cannot fill the controller).

    >>> import io
    >>> seen = []
    >>> read_lines(io.BufferedReader(io.BytesIO(b"a\\n" + b"x" * 50 + b"\\nb\\nc")), seen.append, max_line=10)
    >>> seen
    ['a', 'b', 'c']
    """
    rest, skipping = b"", False
    while chunk := stream.read1(1 << 16):  # type: ignore[attr-defined]
        *whole, rest = (rest + chunk).split(b"\n")
        for line in whole:
            if skipping or len(line) > max_line:
                skipping = False  # (the end of) a line too long to keep
                continue
            on_line(line.decode("utf-8", "replace"))
        if len(rest) > max_line:
            rest, skipping = b"", True
    if rest and not skipping:
        on_line(rest.decode("utf-8", "replace"))


def _decoded(values: Mapping[str, list[str]]) -> dict[str, str]:
    found = {}
    for key, parts in values.items():
        try:
            found[key] = base64.b64decode("".join(parts), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            continue
    return found
