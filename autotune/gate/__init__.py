"""The accuracy gate: the shipped evaluation text, the fp32 reference, teacher-forced agreement, drift, and the
on-disk cache of gate figures."""
