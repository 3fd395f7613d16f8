"""Patch kernels.py (in the working copy it is run in) so that column launches take m along the grid's
first axis: the 'mfirst' probe of probe_l.py."""
s = open("kernels.py").read()
a = "    pid_g = tl.program_id(0)\n    pid_m = tl.program_id(1)\n"
b = ("    pid_g = tl.program_id(1 if COLWISE else 0)\n    pid_m = tl.program_id(0 if COLWISE else 1)\n")
c = "(_cdiv(K // 16, ng), _cdiv(M, bm))"
d = "((_cdiv(M, bm), _cdiv(K // 16, ng)) if colwise else (_cdiv(K // 16, ng), _cdiv(M, bm)))"
assert s.count(a) == 1 and s.count(c) == 1
open("kernels.py", "w").write(s.replace(a, b).replace(c, d))
