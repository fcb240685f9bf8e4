"""Where a rank's memory goes back to the OS, and what ort_zero keeps from step to step, on the CPU.

    heap.py         glibc's heap hands its free pages back (at layer boundaries once RSS has grown, after each forward
                    and backward of an ORT session): ORT_ZERO_TRIM_HEAP
    footprint.py    what ORTModule keeps once its session exists, cut down; the trims after ORT's forward and backward
    output_pool.py  the torch kernels' outputs written into buffers kept from step to step: ORT_ZERO_OUTPUT_POOL
    arena.py        whether an ORT session keeps its CPU arena: ORT_ZERO_CPU_MEM_ARENA

The switches are read in `ort_zero.settings`, with every other setting; what each saves is measured in
docs/memory.md and docs/benchmarks.md.
"""
