"""Hugging Face Transformers: a small GPT-2 (configured here, nothing
downloaded) trained by Trainer on the character corpus of ../charlm.py,
for `accelerate launch` (or torchrun, or rdzv's warm launcher: Trainer
reads torchrun's environment). Without GPUs it trains on CPU over gloo.

Checkpoints are Trainer's own: output_dir is the job's checkpoint.dir, so
Trainer writes <RDZV_CHECKPOINT_DIR>/checkpoint-<N>/ every
--checkpoint-every steps, and rdzv's RdzvCallback marks each complete once
Trainer has written it. A restarted generation, on any number of nodes,
resumes from rdzv's choice with trainer.train(resume_from_checkpoint=...).
"""

import argparse
import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import charlm  # noqa: E402
import rdzv  # noqa: E402
from rdzv.integrations.transformers import RdzvCallback, resume_checkpoint  # noqa: E402


class Windows(torch.utils.data.Dataset):
    """Fixed windows of the corpus, as a tokenised text data set is."""

    def __init__(self, data: torch.Tensor, block: int):
        self.data, self.block = data, block

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block

    def __getitem__(self, i: int) -> dict:
        x = self.data[i * self.block:(i + 1) * self.block]
        return {"input_ids": x, "labels": x}


class LossLines(TrainerCallback):
    """Prints Trainer's logged loss (the world's mean) as RDZV_LOSS lines."""

    def __init__(self, resumed: str):
        self.resumed = resumed

    def on_train_begin(self, args, state, control, **kwargs):
        if self.resumed and state.is_world_process_zero:
            charlm.log("RDZV_RESUMED", step=state.global_step, path=self.resumed, generation=charlm.generation())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            charlm.log("RDZV_LOSS", step=state.global_step, loss=float(logs["loss"]),
                       generation=charlm.generation(), world=args.world_size)


class StepTime(TrainerCallback):
    """Sleeps after each step: tests stretch the run with --step-time."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--batch", type=int, default=4, help="per-process batch")
    p.add_argument("--step-time", type=float, default=0.0, help="seconds to sleep per step (tests stretch the run)")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    block = 32
    config = GPT2Config(vocab_size=len(charlm.VOCAB), n_positions=block, n_embd=48, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    ckpt_dir = rdzv.checkpoint_dir() or "hf_gpt2-checkpoints"
    targs = TrainingArguments(
        output_dir=ckpt_dir,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="steps",
        save_steps=args.checkpoint_every,
        report_to=[],
        use_cpu=not cuda,
        ddp_backend=None if cuda else "gloo",
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    resumed = resume_checkpoint()
    trainer = Trainer(model=model, args=targs, train_dataset=Windows(charlm.corpus(), block),
                      callbacks=[RdzvCallback(), LossLines(resumed or ""), StepTime(args.step_time)])
    trainer.train(resume_from_checkpoint=resumed)
    if trainer.is_world_process_zero():
        loss = next((h["loss"] for h in reversed(trainer.state.log_history) if "loss" in h), float("nan"))
        charlm.log("RDZV_DONE", steps=trainer.state.global_step, final_loss=float(loss), generation=charlm.generation())


if __name__ == "__main__":
    main()
