# Aurora PostgreSQL Serverless v2: scales to 0 ACU and pauses when idle. RDS generates the master password and
# keeps it in Secrets Manager (rotated, never in Terraform state); the function reads it at cold start.

resource "aws_db_subnet_group" "this" {
  name        = var.name
  description = "Overspill database subnets"
  subnet_ids  = var.subnet_ids
  tags        = local.tags
}

resource "aws_rds_cluster_parameter_group" "this" {
  name        = "${var.name}-aurora-postgresql${split(".", var.db_engine_version)[0]}"
  family      = "aurora-postgresql${split(".", var.db_engine_version)[0]}"
  description = "Overspill: log DDL and slow statements"

  parameter {
    name  = "log_statement"
    value = "ddl"
  }

  parameter {
    name  = "log_min_duration_statement"
    value = "1000"
  }

  parameter {
    name         = "rds.force_ssl"
    value        = "1"
    apply_method = "pending-reboot"
  }

  tags = local.tags
}

resource "aws_rds_cluster" "this" {
  #checkov:skip=CKV2_AWS_8:Automated backups (db_backup_retention_days) and deletion protection cover this database; an AWS Backup plan is an account-level choice outside this module.
  cluster_identifier                  = var.name
  engine                              = "aurora-postgresql"
  engine_mode                         = "provisioned"
  engine_version                      = var.db_engine_version
  database_name                       = var.db_name
  master_username                     = "overspill"
  manage_master_user_password         = true
  master_user_secret_kms_key_id       = aws_kms_key.this.arn
  storage_encrypted                   = true
  kms_key_id                          = aws_kms_key.this.arn
  db_subnet_group_name                = aws_db_subnet_group.this.name
  vpc_security_group_ids              = [aws_security_group.database.id]
  db_cluster_parameter_group_name     = aws_rds_cluster_parameter_group.this.name
  iam_database_authentication_enabled = true
  enabled_cloudwatch_logs_exports     = ["postgresql"]
  backup_retention_period             = var.db_backup_retention_days
  copy_tags_to_snapshot               = true
  deletion_protection                 = var.db_deletion_protection
  skip_final_snapshot                 = var.db_skip_final_snapshot
  final_snapshot_identifier           = var.db_skip_final_snapshot ? null : "${var.name}-final"

  serverlessv2_scaling_configuration {
    min_capacity             = var.db_min_capacity
    max_capacity             = var.db_max_capacity
    seconds_until_auto_pause = var.db_min_capacity == 0 ? var.db_auto_pause_seconds : null
  }

  tags       = local.tags
  depends_on = [aws_cloudwatch_log_group.database]
}

resource "aws_rds_cluster_instance" "this" {
  #checkov:skip=CKV_AWS_118:Enhanced monitoring keeps an agent reporting every few seconds and bills CloudWatch while the database is otherwise paused; Performance Insights covers query load.
  identifier                            = "${var.name}-1"
  cluster_identifier                    = aws_rds_cluster.this.id
  engine                                = aws_rds_cluster.this.engine
  engine_version                        = aws_rds_cluster.this.engine_version
  instance_class                        = "db.serverless"
  db_subnet_group_name                  = aws_db_subnet_group.this.name
  auto_minor_version_upgrade            = true
  performance_insights_enabled          = true
  performance_insights_kms_key_id       = aws_kms_key.this.arn
  performance_insights_retention_period = 7
  publicly_accessible                   = false
  copy_tags_to_snapshot                 = true
  tags                                  = local.tags
}
