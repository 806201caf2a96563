"""Pure request routing: policy rules, request classes, session affinity, gradual moves."""
