# gdb on the CPU emulator (no GPU needed): the same stop as step_decode_kernel.cuda-gdb. The
# emulator runs the kernel's threads as fibers on one CPU thread, so a breakpoint's condition
# picks the thread (threadIdx is a plain variable there).
set pagination off
set trace-commands on
break decode_attention.cuh:180 if threadIdx.x == 9 && blockIdx.y == 0
run
print blockIdx
print threadIdx
print row
print kv_head
print chunk
print key_slot
print a.lanes
print a.head_dim
print q[0]
delete
break decode_attention.cuh:180 if threadIdx.x == 0 && blockIdx.y == 3
continue
print kv_head
print head0
print heads
delete
continue
# What the session must show (checked by tutorials/debug/run_session.py, which the docs build
# and the CTest tutorial_11_debugger run):
# expect: at line 180: float acc[kGroupTile][kValuesPerThread] = {};
# expect: print threadIdx => {x = 9, y = 0, z = 0}
# expect: print chunk => 9
# expect: print key_slot => 0
# expect: print a.lanes => 16
# expect: print kv_head => 3
# expect: print head0 => 12
