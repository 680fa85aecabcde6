variable "region" {
  description = "AWS region to deploy to."
  type        = string
  default     = "us-east-1"
}

variable "aws_endpoint_url" {
  description = "One endpoint for every AWS API (a moto server for tests); null for AWS itself."
  type        = string
  default     = null
}

variable "name" {
  description = "Name of the deployment."
  type        = string
  default     = "overspill"
}

variable "lambda_zip_path" {
  description = "The package built by terraform/build_lambda.py."
  type        = string
  default     = "../../../dist/overspill-lambda.zip"
}

variable "vpc_id" {
  description = "VPC for the function and the database."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets (two or more AZs) with a route to AWS APIs."
  type        = list(string)
}

variable "bootstrap_api_key" {
  description = "First admin API key (ovs_<id>_<secret>)."
  type        = string
  sensitive   = true
}

variable "aws_image_id" {
  description = "AMI of the training instances (Docker + NVIDIA drivers); the broker may launch no other."
  type        = string
  default     = ""
}

variable "db_deletion_protection" {
  description = "Protect the database from deletion."
  type        = bool
  default     = true
}

variable "db_skip_final_snapshot" {
  description = "Delete the database without a final snapshot."
  type        = bool
  default     = false
}

variable "force_destroy_buckets" {
  description = "Let destroy delete non-empty buckets."
  type        = bool
  default     = false
}
