"""The collocation benchmark harness (``collocate bench``).

Why a harness of our own: the simulator, the ``auto`` policy and the emulated GPUs all rest on an
interference and power model whose parameters were solved from one published GPU pair. This
package measures how the built-in workloads behave alone and collocated on a real GPU (time
slicing and MPS), fits the model to those measurements (``calibrate``) and replays a small real
trace through the daemon to compare with the simulator (``minitrace``).

Layers, each usable on its own:

* ``workloads`` names → built-in models and their nominal epoch sizes;
* ``plan`` the pure list of scenarios (printable with ``collocate bench run --list``);
* ``worker`` one training process (``python -m collocate.bench.worker``);
* ``runner`` launches the workers of a scenario at once and samples the GPU meanwhile;
* ``report`` writes the CSV summary, the markdown table and the plots;
* ``fit`` / ``calibrate`` least-squares fit of the interference and power model;
* ``minitrace`` / ``minitrace_run`` the real mini-trace and its comparison with the simulator.

``--device cpu`` runs the same machinery with tiny models; every output then says that its
numbers are CPU numbers, not GPU measurements.
"""
