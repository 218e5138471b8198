//! Automation channels: scheduled prompts (cron) and webhooks post gateway output into them.
