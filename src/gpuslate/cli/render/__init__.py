"""How results look: one module per result family, the plain and the rich helpers, the guarded
output streams and the progress line. Nothing here acts on a host."""
