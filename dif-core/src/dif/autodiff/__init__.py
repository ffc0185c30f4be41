"""Reverse-mode autodiff over DiffIR: the VJP column of the op table (`vjp_rule`) and the program
transform (`grad_program`) that turns a forward program into one computing loss and gradients."""

from dif.autodiff.registry import NoVjpError, VjpArgs, has_vjp, ops_with_vjp, register_vjp, vjp, vjp_rule
from dif.autodiff.transform import GradProgram, grad_program

__all__ = [
    "GradProgram",
    "NoVjpError",
    "VjpArgs",
    "grad_program",
    "has_vjp",
    "ops_with_vjp",
    "register_vjp",
    "vjp",
    "vjp_rule",
]
