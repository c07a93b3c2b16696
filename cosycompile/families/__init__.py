"""Model families: one sub-folder per CosyVoice generation, named by the value a recipe or a model dir
names (``cosyvoice2``, ``cosyvoice3``, ...). A folder whose name starts with ``_`` is work in progress
and not a plug-in."""
