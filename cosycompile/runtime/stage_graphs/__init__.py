"""The graphs each stage's engines hold: their names, inputs, outputs and dims.

They are the contract between the build side (a stage exports and checks these graphs) and the
runtime (a stage runtime feeds them by these names), so they live here, below both: the runtime
reads a bundle without importing any stage plug-in. One module per stage, so that editing one
stage's graphs changes no other stage's keys.
"""
