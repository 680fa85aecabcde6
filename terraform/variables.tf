variable "name" {
  description = "Name of the deployment: prefixes every resource (function, API, queues, buckets, database, roles)."
  type        = string
  default     = "overspill"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,30}[a-z0-9]$", var.name))
    error_message = "name must be 3-32 characters of lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "lambda_zip_path" {
  description = "Path of the broker's deployment package (built by terraform/build_lambda.py)."
  type        = string

  validation {
    condition     = endswith(var.lambda_zip_path, ".zip")
    error_message = "lambda_zip_path must name a .zip file built by terraform/build_lambda.py."
  }
}

variable "lambda_runtime" {
  description = "Lambda Python runtime; must match the --python-version the package was built for."
  type        = string
  default     = "python3.12"

  validation {
    condition     = contains(["python3.11", "python3.12", "python3.13"], var.lambda_runtime)
    error_message = "lambda_runtime must be python3.11, python3.12 or python3.13."
  }
}

variable "lambda_architecture" {
  description = "Lambda CPU architecture; must match the --platform the package was built for."
  type        = string
  default     = "x86_64"

  validation {
    condition     = contains(["x86_64", "arm64"], var.lambda_architecture)
    error_message = "lambda_architecture must be x86_64 or arm64."
  }
}

variable "lambda_memory_mb" {
  description = "Memory of the broker function in MB (CPU scales with it)."
  type        = number
  default     = 1024

  validation {
    condition     = var.lambda_memory_mb >= 256 && var.lambda_memory_mb <= 10240
    error_message = "lambda_memory_mb must be between 256 and 10240."
  }
}

variable "lambda_timeout_seconds" {
  description = "Timeout of one invocation. API requests are cut at 30 s by API Gateway anyway; ticks and price refreshes use the rest."
  type        = number
  default     = 300

  validation {
    condition     = var.lambda_timeout_seconds >= 30 && var.lambda_timeout_seconds <= 900
    error_message = "lambda_timeout_seconds must be between 30 and 900 (Lambda's limit)."
  }
}

variable "lambda_reserved_concurrency" {
  description = "Concurrent executions reserved for (and capping) the broker; bounds database connections too."
  type        = number
  default     = 20

  validation {
    condition     = var.lambda_reserved_concurrency >= 2 && var.lambda_reserved_concurrency <= 1000
    error_message = "lambda_reserved_concurrency must be between 2 and 1000."
  }
}

variable "vpc_id" {
  description = "VPC for the function and the database."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "vpc_id must be a VPC id (vpc-...)."
  }
}

variable "subnet_ids" {
  description = "Private subnets (two or more AZs) for the function and the database. They need a route to the EC2, Pricing, SQS and Secrets Manager APIs (NAT gateway or VPC endpoints)."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) >= 2 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "subnet_ids must list at least two subnet ids (subnet-...) in different availability zones."
  }
}

variable "broker_id" {
  description = "Broker id: tags every instance the broker launches; it may only terminate instances carrying it."
  type        = string
  default     = "overspill"

  validation {
    condition     = can(regex("^[A-Za-z0-9._-]{1,128}$", var.broker_id))
    error_message = "broker_id must be 1-128 letters, digits, dots, underscores or hyphens."
  }
}

variable "bootstrap_api_key" {
  description = "Admin API key installed at first start (ovs_<id>_<secret>); create a fresh one, e.g. with `overspill keys create`."
  type        = string
  sensitive   = true

  validation {
    condition     = can(regex("^ovs_[A-Za-z0-9]+_[A-Za-z0-9_-]{16,}$", var.bootstrap_api_key)) && var.bootstrap_api_key != "ovs_devadmin_local-development-only"
    error_message = "bootstrap_api_key must look like ovs_<id>_<secret of 16+ characters> and must not be the public development key."
  }
}

variable "bootstrap_tenant" {
  description = "Tenant of the bootstrap admin key."
  type        = string
  default     = "default"

  validation {
    condition     = can(regex("^[A-Za-z0-9._-]{1,64}$", var.bootstrap_tenant))
    error_message = "bootstrap_tenant must be 1-64 letters, digits, dots, underscores or hyphens."
  }
}

variable "simulated" {
  description = "Run the built-in simulated clouds and on-prem cluster (a demo deployment); false for real use."
  type        = bool
  default     = false
}

variable "aws_regions" {
  description = "Regions of the AWS price feed (and of launches when aws_launch is true). Empty: the deployment's region."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for r in var.aws_regions : can(regex("^[a-z]{2}(-gov)?-[a-z]+-[0-9]$", r))])
    error_message = "aws_regions must be AWS region names such as us-east-1."
  }
}

variable "aws_launch" {
  description = "Launch jobs on EC2 (spot and on-demand) in aws_regions; needs aws_image_id."
  type        = bool
  default     = false
}

variable "aws_image_id" {
  description = "AMI with Docker and NVIDIA drivers that training instances boot (required when aws_launch is true)."
  type        = string
  default     = ""

  validation {
    condition     = var.aws_image_id == "" || can(regex("^ami-[0-9a-f]+$", var.aws_image_id))
    error_message = "aws_image_id must be an AMI id (ami-...) or empty."
  }
}

variable "aws_allowed_image_ids" {
  description = "AMIs the broker may launch (IAM allows RunInstances with these images only). Empty: aws_image_id when it is set."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for i in var.aws_allowed_image_ids : can(regex("^ami-[0-9a-f]+$", i))])
    error_message = "aws_allowed_image_ids must be AMI ids (ami-...)."
  }
}

variable "aws_allowed_image_owners" {
  description = "Also allow any AMI owned by these accounts (12-digit ids, or amazon / aws-marketplace), e.g. for a pipeline publishing new AMIs. Empty: only aws_allowed_image_ids."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for o in var.aws_allowed_image_owners : can(regex("^([0-9]{12}|amazon|aws-marketplace)$", o))])
    error_message = "aws_allowed_image_owners must be 12-digit account ids, amazon or aws-marketplace."
  }
}

variable "aws_instance_subnet_ids" {
  description = "Subnet per availability zone for training instances, e.g. {\"us-east-1a\" = \"subnet-...\"}."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for s in values(var.aws_instance_subnet_ids) : can(regex("^subnet-[0-9a-f]+$", s))])
    error_message = "aws_instance_subnet_ids values must be subnet ids (subnet-...)."
  }
}

variable "instance_secret_prefix" {
  description = "Training instances may read the Secrets Manager secrets whose names start with this (jobs' named secrets). Null: \"<name>/jobs/\". Must end with / and may not cover the broker's own secrets (<name>/broker/)."
  type        = string
  default     = null

  validation {
    condition = var.instance_secret_prefix == null ? true : (
      can(regex("^[A-Za-z0-9_+=.@-]+(/[A-Za-z0-9_+=.@-]+)*/$", var.instance_secret_prefix))
      && !startswith("${var.name}/broker/", var.instance_secret_prefix)
    )
    error_message = "instance_secret_prefix must be a secret name prefix ending with / (letters, digits, _+=.@-), and must not cover <name>/broker/."
  }
}

variable "instance_ecr_repository_arns" {
  description = "ECR repositories training instances may pull images from (ARNs; a trailing * matches a name prefix). Empty: no ECR access (public registries only)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for r in var.instance_ecr_repository_arns : can(regex("^arn:aws[a-z-]*:ecr:[a-z0-9-]+:[0-9]{12}:repository/[a-z0-9][a-z0-9._/-]*\\*?$", r))])
    error_message = "instance_ecr_repository_arns must be ECR repository ARNs (arn:aws:ecr:REGION:ACCOUNT:repository/NAME, optionally ending with *)."
  }
}

variable "generated_secrets_version" {
  description = "The module generates the callback secret and the metrics token (write-only: never in the state); raise this to generate new ones. New callback secrets invalidate the callback tokens of running instances."
  type        = number
  default     = 1

  validation {
    condition     = var.generated_secrets_version >= 1 && floor(var.generated_secrets_version) == var.generated_secrets_version
    error_message = "generated_secrets_version must be a whole number of at least 1."
  }
}

variable "extra_environment" {
  description = "More broker settings as OVERSPILL_* environment variables (see the README's Configuration table)."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k in keys(var.extra_environment) : can(regex("^OVERSPILL_[A-Z0-9_]+$", k))])
    error_message = "extra_environment keys must be OVERSPILL_* broker settings."
  }
}

variable "tick_schedule" {
  description = "EventBridge Scheduler expression for the control-loop tick."
  type        = string
  default     = "rate(1 minute)"

  validation {
    condition     = can(regex("^(rate|cron)\\(.+\\)$", var.tick_schedule))
    error_message = "tick_schedule must be a rate(...) or cron(...) expression."
  }
}

variable "price_refresh_schedule" {
  description = "EventBridge Scheduler expression for refreshing every price feed."
  type        = string
  default     = "rate(5 minutes)"

  validation {
    condition     = can(regex("^(rate|cron)\\(.+\\)$", var.price_refresh_schedule))
    error_message = "price_refresh_schedule must be a rate(...) or cron(...) expression."
  }
}

variable "reports_schedule" {
  description = "EventBridge Scheduler expression for the report runner: each run renders and delivers the report schedules stored in the database that are due (their own cron + time zone), so this sets their granularity."
  type        = string
  default     = "rate(15 minutes)"

  validation {
    condition     = can(regex("^(rate|cron)\\(.+\\)$", var.reports_schedule))
    error_message = "reports_schedule must be a rate(...) or cron(...) expression."
  }
}

variable "schedule_timezone" {
  description = "Time zone of cron schedules (IANA name)."
  type        = string
  default     = "UTC"

  validation {
    condition     = can(regex("^[A-Za-z_]+(/[A-Za-z0-9_+-]+)*$", var.schedule_timezone))
    error_message = "schedule_timezone must be an IANA time zone name such as UTC or Europe/Paris."
  }
}

variable "log_retention_days" {
  description = "Retention of the function's, the API's and the database's CloudWatch log groups."
  type        = number
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a CloudWatch Logs retention value (1, 3, 5, 7, 14, 30, ..., 365, 400, ..., 3653)."
  }
}

variable "checkpoint_expiry_days" {
  description = "Checkpoints older than this are deleted (jobs checkpoint every few minutes; old ones only cost)."
  type        = number
  default     = 30

  validation {
    condition     = var.checkpoint_expiry_days >= 1
    error_message = "checkpoint_expiry_days must be at least 1."
  }
}

variable "noncurrent_version_expiry_days" {
  description = "Overwritten or deleted object versions in both buckets are kept this many days."
  type        = number
  default     = 7

  validation {
    condition     = var.noncurrent_version_expiry_days >= 1
    error_message = "noncurrent_version_expiry_days must be at least 1."
  }
}

variable "reports_infrequent_access_after_days" {
  description = "Reports move to STANDARD_IA after this many days."
  type        = number
  default     = 30

  validation {
    condition     = var.reports_infrequent_access_after_days >= 30
    error_message = "reports_infrequent_access_after_days must be at least 30 (S3's minimum for STANDARD_IA)."
  }
}

variable "reports_expiry_days" {
  description = "Reports older than this are deleted."
  type        = number
  default     = 1096

  validation {
    condition     = var.reports_expiry_days > var.reports_infrequent_access_after_days
    error_message = "reports_expiry_days must be greater than reports_infrequent_access_after_days."
  }
}

variable "force_destroy_buckets" {
  description = "Let terraform destroy delete non-empty buckets (tests and throw-away deployments only)."
  type        = bool
  default     = false
}

variable "db_engine_version" {
  description = "Aurora PostgreSQL engine version (Serverless v2 scaling to 0 ACU needs 13.15, 14.12, 15.7, 16.3 or newer)."
  type        = string
  default     = "16.6"

  validation {
    condition     = can(regex("^1[3-9]\\.[0-9]+$", var.db_engine_version))
    error_message = "db_engine_version must be an Aurora PostgreSQL version such as 16.6."
  }
}

variable "db_name" {
  description = "Name of the broker's database."
  type        = string
  default     = "overspill"

  validation {
    condition     = can(regex("^[a-z][a-z0-9_]{0,62}$", var.db_name))
    error_message = "db_name must start with a letter and hold lowercase letters, digits and underscores (max 63)."
  }
}

variable "db_min_capacity" {
  description = "Minimum Aurora capacity units; 0 lets the database pause when idle (nothing billed but storage)."
  type        = number
  default     = 0

  validation {
    condition     = var.db_min_capacity >= 0 && var.db_min_capacity <= 256
    error_message = "db_min_capacity must be between 0 and 256 ACU."
  }
}

variable "db_max_capacity" {
  description = "Maximum Aurora capacity units."
  type        = number
  default     = 4

  validation {
    condition     = var.db_max_capacity >= 1 && var.db_max_capacity <= 256
    error_message = "db_max_capacity must be between 1 and 256 ACU."
  }
}

variable "db_auto_pause_seconds" {
  description = "With db_min_capacity = 0: idle seconds before the database pauses (the first request after a pause waits ~15 s)."
  type        = number
  default     = 900

  validation {
    condition     = var.db_auto_pause_seconds >= 300 && var.db_auto_pause_seconds <= 86400
    error_message = "db_auto_pause_seconds must be between 300 and 86400."
  }
}

variable "db_backup_retention_days" {
  description = "Days of automated database backups."
  type        = number
  default     = 7

  validation {
    condition     = var.db_backup_retention_days >= 1 && var.db_backup_retention_days <= 35
    error_message = "db_backup_retention_days must be between 1 and 35."
  }
}

variable "db_deletion_protection" {
  description = "Refuse to delete the database; set false (and db_skip_final_snapshot as you wish) to tear down."
  type        = bool
  default     = true
}

variable "db_skip_final_snapshot" {
  description = "Delete the database without a final snapshot (tests and throw-away deployments only)."
  type        = bool
  default     = false
}

variable "api_throttling_rate_limit" {
  description = "Steady-state requests per second the HTTP API lets through."
  type        = number
  default     = 50

  validation {
    condition     = var.api_throttling_rate_limit > 0
    error_message = "api_throttling_rate_limit must be positive."
  }
}

variable "api_throttling_burst_limit" {
  description = "Burst of requests the HTTP API lets through."
  type        = number
  default     = 100

  validation {
    condition     = var.api_throttling_burst_limit > 0
    error_message = "api_throttling_burst_limit must be positive."
  }
}

variable "interruption_message_retention_seconds" {
  description = "How long an undelivered spot warning stays in the queue (it is useless after its 2 minutes)."
  type        = number
  default     = 3600

  validation {
    condition     = var.interruption_message_retention_seconds >= 60 && var.interruption_message_retention_seconds <= 1209600
    error_message = "interruption_message_retention_seconds must be between 60 and 1209600."
  }
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
