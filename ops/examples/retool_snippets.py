# Snippets a policy writes during ReTool-style math rollouts, one per "# %%" cell.
# `codepool run` executes every cell in its own sandbox and prints the tool message.
# %%
print(2 + 3)
# %%
total = sum(i * i for i in range(1, 101))
print(total)
# %%
import numpy as np

a = np.arange(12).reshape(3, 4)
print(a.sum(axis=0), np.linalg.matrix_rank(a))
# %%
import sympy as sp

x = sp.symbols("x")
print(sp.solve(x**2 - 5 * x + 6, x))
# %%
from fractions import Fraction

Fraction(3, 4) + Fraction(1, 6)
# %%
count = 0
for a in range(1, 200):
    for b in range(a, 200):
        if (a * a + b * b) ** 0.5 % 1 == 0:
            count += 1
print(count)
# %%
print(1 / 0)
# %%
while True:
    pass
