"""Advantage estimators, AVSPO trigger, policy loss; the DeepSpeed learner group."""
