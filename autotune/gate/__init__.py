"""The accuracy gate: the shipped evaluation text, the fp32 reference, teacher-forced agreement in prefill and
through the decode path, and the on-disk cache of gate figures."""
