"""The simulator core both simulated machines (ascend-sim, dsp-sim) are built on.

A machine adds only its instruction set and its figures from the target description; what
every simulated machine needs lives here:

* `buffers`    memory levels with capacity and alignment, bump allocation, the one
               `CapacityError` (an `OpcError`: the CLI prints it as one clean line);
* `instr`      the instruction protocol: unit (pipe), buffers read and written, cost, execute;
* `program`    the one program container both machines' programs are (`SimProgram`: per-core
               instruction lists, info, high-water marks, declared cycles), its `listing()`
               (`opcompiler run --listing`), and `Repeat` blocks of timing programs;
* `scoreboard` in-order pipes per core, a buffer scoreboard (RAW / WAR / WAW, optional
               set_flag/wait_flag cost), shared-bandwidth channels, barriers, and the exact
               steady-state skip of repeated blocks;
* `trace`      an independent accounting of a functional replay (cycles from what the
               execution touched, by a longest-path pass; never the scoreboard);
* `profile`    one typed outcome: `Timing` (what a replay produced) and `Profile` (cycles,
               time at the clock, busy per unit, bytes per level, peak, roofline), the one
               bound rule (`bound_of`) and a run's report (`report`);
* `clock`      clocks in Hz on both machines, and GB/s -> bytes per cycle;
* `machine`    a machine read once per target description (`load`), its memory levels;
* `shell`      run / measure / the report around a machine's hooks (`SimShell`; the
               `Backend` side, build included, is `opcompiler.backend.sim.SimBackend`);
* `tir_expr`   the one TIR expression evaluator (TIR's `Div` / `FloorDiv` semantics).

Nothing here imports `opcompiler.backend` or the schedules: the simulator core sits below them.
"""
from .buffers import Arena, CapacityError, Level
from .clock import Clocked
from .instr import Instruction
from .program import Repeat, SimProgram
from .profile import Profile, Timing
from .scoreboard import Channels, Scoreboard, barrier, run_repeated
from .trace import Event, Trace

__all__ = ["Arena", "CapacityError", "Level", "Clocked", "Instruction", "Repeat", "SimProgram", "Profile", "Timing",
           "Channels", "Scoreboard", "barrier", "run_repeated", "Event", "Trace"]
