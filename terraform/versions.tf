terraform {
  required_version = ">= 1.11.0, < 2.0.0" # write-only arguments (secrets.tf)

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
}
